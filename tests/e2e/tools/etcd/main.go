// Command etcd is etcd's own server main, built from the pinned module
// (`go install go.etcd.io/etcd/server/v3` fails on its replace directives).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
