package repocheck

// The config reference check lists each registered kind's section fields.
import _ "github.com/tabletflow/tabletflow/adapters"
