// Command etcd is etcd's server, built from go.etcd.io/etcd/server/v3 at the
// version go.mod pins. etcd's own main module (go.etcd.io/etcd/v3) has
// replace directives, so `go install` cannot build it; this module requires
// the server module instead and calls its entry point. `make vitess` builds
// it for the Vitess test bed's topology server (testbed/vitessbed).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
