package config

import (
	"encoding/json"
)

// The config package's tests run with two stand-in kinds, named as the
// design's example names them, that take any section but one with a "bad"
// field: the real adapters' checks are tested with them, in package
// adapters.
func init() {
	parse := func(section []byte) (map[string]json.RawMessage, error) {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(section, &fields); err != nil {
			return nil, err
		}
		if _, bad := fields["bad"]; bad {
			return nil, FieldErr("bad", "rejected by the test kind")
		}
		return fields, nil
	}
	RegisterSource(NewKind("tabletd", parse))
	RegisterSink(NewKind("jsonl", parse))
}
