package activities

// Some tests read sections with the real kinds' parsers, which the
// worker's wiring registers; the activities themselves import no adapter.
import _ "github.com/tabletflow/tabletflow/adapters"
