package main

import (
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"

	"github.com/tabletflow/tabletflow/workflows"
)

func temporalSA(id string) temporal.SearchAttributes {
	return temporal.NewSearchAttributes(workflows.SAStream.ValueSet(id))
}

// quiet drops the SDK's client logs: the starter prints what matters.
type quiet struct{}

var _ log.Logger = quiet{}

func (quiet) Debug(string, ...any) {}
func (quiet) Info(string, ...any)  {}
func (quiet) Warn(string, ...any)  {}
func (quiet) Error(string, ...any) {}
