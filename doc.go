// Package tabletflow streams change data capture out of tablet-sharded
// databases with Temporal as the durable orchestrator. The code lives in
// the sub-packages (workflows, activities, picker, source, sink, tabletd);
// this package holds only repository-level checks.
package tabletflow
