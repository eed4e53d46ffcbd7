package workflows

import (
	"encoding/json"
	"fmt"

	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/tabletflow/tabletflow/codec"
)

// Signals come from outside the project's code (anyone may send any
// payload to any signal name), so they are received raw and decoded here.
// The SDK's own Receive, given a payload that does not decode, drops it
// and blocks for the next signal on that channel: inside a selector's
// callback that stalls the whole workflow — a stream would take no report,
// command or continue-as-new until another signal of that name came.

// receive takes the next signal from ch into v; a payload that does not
// decode is an error, and v is left as it was. Without own (a workflow
// from before changeSignalHandling) it is the SDK's Receive.
func receive(ctx workflow.Context, ch workflow.ReceiveChannel, v any, own bool) error {
	if !own {
		ch.Receive(ctx, v)
		return nil
	}
	var raw converter.RawValue
	ch.Receive(ctx, &raw)
	return decodeSignal(raw, v)
}

// receiveAsync is receive without blocking: ok reports whether a signal
// was taken (whether or not it decoded).
func receiveAsync(ch workflow.ReceiveChannel, v any, own bool) (ok bool, err error) {
	if !own {
		return ch.ReceiveAsync(v), nil
	}
	var raw converter.RawValue
	if !ch.ReceiveAsync(&raw) {
		return false, nil
	}
	return true, decodeSignal(raw, v)
}

// decodeSignal decodes a signal's payload into v. A json.RawMessage gets
// the JSON text as sent (its own decoder validates it, naming the
// problem); a signal with no input leaves v at its zero value.
func decodeSignal(raw converter.RawValue, v any) error {
	p := raw.Payload()
	if p == nil {
		return nil
	}
	if err := codec.Undecryptable(p); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	if out, ok := v.(*json.RawMessage); ok {
		switch enc := string(p.GetMetadata()[converter.MetadataEncoding]); enc {
		case converter.MetadataEncodingJSON:
			*out = p.GetData()
		case converter.MetadataEncodingNil:
			*out = nil
		default:
			return fmt.Errorf("payload: encoding %q, want %s", enc, converter.MetadataEncodingJSON)
		}
		return nil
	}
	if err := converter.GetDefaultDataConverter().FromPayload(p, v); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	return nil
}
