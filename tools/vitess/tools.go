//go:build tools

// Package tools pins the Vitess commands the test bed (testbed/vitessbed)
// runs. It is a module of its own, so the product's go.mod carries none of
// Vitess's server dependencies; `make vitess` builds these commands from it
// into .vitess/<version>/bin. `go mod tidy` reads this file (the build tag
// keeps it out of every build), so go.sum holds every package the commands
// import: a command missing here fails its build with "missing go.sum entry".
package tools

import (
	_ "vitess.io/vitess/go/cmd/mysqlctl"
	_ "vitess.io/vitess/go/cmd/vtctld"
	_ "vitess.io/vitess/go/cmd/vtctldclient"
	_ "vitess.io/vitess/go/cmd/vtgate"
	_ "vitess.io/vitess/go/cmd/vttablet"
)
