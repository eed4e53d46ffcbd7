package codec

import (
	"net/http"
	"slices"

	"go.temporal.io/sdk/converter"
)

// maxRequestBytes bounds a codec request: payloads are at most 2 MB on the
// server, and a request carries a few.
const maxRequestBytes = 8 << 20

// Handler serves the codec's /encode and /decode endpoints (the remote
// codec protocol of `temporal --codec-endpoint` and the Web UI), with CORS
// for the browser origins allowed (the Web UI's). Anyone who can reach it
// can decrypt: listen on an address only those who hold the key can
// reach.
func (c *Codec) Handler(origins []string) http.Handler {
	inner := converter.NewPayloadCodecHTTPHandler(c)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if origin := r.Header.Get("Origin"); origin != "" && slices.Contains(origins, origin) {
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Credentials", "true")
			h.Set("Access-Control-Allow-Methods", "POST, OPTIONS")
			h.Set("Access-Control-Allow-Headers", "Content-Type, X-Namespace, Authorization")
			h.Add("Vary", "Origin")
		}
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusOK)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxRequestBytes)
		inner.ServeHTTP(w, r)
	})
}
