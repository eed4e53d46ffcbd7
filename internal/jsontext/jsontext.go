// Package jsontext writes JSON text byte for byte as encoding/json does,
// without its reflection, for the few hot encoders that must match it
// (tabletd's workload rows, the PostgreSQL benchmark's raw loop).
package jsontext

import "encoding/json"

// AppendString appends s as encoding/json writes a string: printable
// ASCII other than the characters it escapes is copied, anything else
// goes through json.Marshal.
func AppendString[S ~string | ~[]byte](b []byte, s S) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(string(s)) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
