package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// checkFields reports the first JSON object key that t has no field for,
// with its full path ("batch.maxRecordz"); encoding/json's own error names
// only the key.
func checkFields(data []byte, t reflect.Type) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil // the real decode reports syntax errors
	}
	return walkFields(v, t, "")
}

func walkFields(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch val := v.(type) {
	case map[string]any:
		if t.Kind() != reflect.Struct {
			return nil
		}
		fields := jsonFields(t)
		for key, sub := range val {
			ft, ok := fields[key]
			if !ok {
				return &FieldError{Field: join(path, key), Msg: "unknown field"}
			}
			if err := walkFields(sub, ft, join(path, key)); err != nil {
				return err
			}
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return nil
		}
		for i, sub := range val {
			if err := walkFields(sub, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonFields maps a struct's JSON names to field types (exact names:
// strict input also means exact case).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
