// Command etcd is a thin wrapper around etcdmain, so that etcd can be built
// from go.etcd.io/etcd/server/v3 (whose own replace directives rule out
// `go install`).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
