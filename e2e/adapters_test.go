package e2e

// The tests decode stream configs as the worker and the starter do, with
// every kind the wiring registers.
import _ "github.com/tabletflow/tabletflow/adapters"
