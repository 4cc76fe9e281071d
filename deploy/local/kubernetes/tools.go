//go:build tools

// Package kubernetes pins the Kubernetes control-plane commands that devservices builds:
// `go build k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager`
// from this directory. k8s.io/kubernetes replaces its staging modules with paths its module
// zip lacks, so go.mod replaces each one with its published v0.37.2 instead.
package kubernetes

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
