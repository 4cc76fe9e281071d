// Command etcd is the etcd server, built from the Go module proxy for tuneloop's local
// Kubernetes API (devservices/kubernetes.py builds it into ~/.cache/tuneloop/bin).
//
// `go install go.etcd.io/etcd/server/v3@...` cannot be used: etcd's server/go.mod carries
// replace directives pointing at sibling directories, which go install refuses. This wrapper
// is the same one-line main as etcd's own server/main.go.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
