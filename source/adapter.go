package source

import "github.com/tabletflow/tabletflow/config"

// Adapter is one kind of source as the programs that run streams see it:
// its part of the stream config (decoded and checked by config.Decode
// once registered) and how to open it. Each adapter package exports one;
// package adapters lists them.
type Adapter struct {
	config.Kind
	// Open returns a client for a checked source section. It does not
	// need to connect: the first call may.
	Open func(cfg config.Source) (Source, error)
}

// OpenParsed is an Adapter's Open for a kind whose section parse reads
// (an error names the field under "source.") and open opens.
func OpenParsed[C any](parse func(section []byte) (C, error), open func(C) (Source, error)) func(config.Source) (Source, error) {
	return func(cfg config.Source) (Source, error) {
		c, err := parse(cfg.Spec)
		if err != nil {
			return nil, config.InSection("source", err)
		}
		return open(c)
	}
}
