package picker

// The stream configs these tests decode name real source and sink kinds,
// which the worker's wiring registers.
import _ "github.com/tabletflow/tabletflow/adapters"
