//go:build tools

// Package kubeflow pins the controllers that devservices builds with their own Kubernetes
// libraries: the Kubeflow Trainer v2.3.0 needs k8s.io/api v0.36 (its generated OpenAPI names
// corev1.PodStatusResult, gone in v0.37), so it cannot share the control plane's module.
package kubeflow

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
)
