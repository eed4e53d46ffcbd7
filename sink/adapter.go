package sink

import "github.com/tabletflow/tabletflow/config"

// Adapter is one kind of sink as the programs that run streams see it:
// its part of the stream config (decoded and checked by config.Decode
// once registered) and how to open a stream's sink.
type Adapter struct {
	config.Kind
	// Open returns the sink of one stream for a checked sink section.
	Open func(cfg config.Sink, stream string) (Sink, error)
}
