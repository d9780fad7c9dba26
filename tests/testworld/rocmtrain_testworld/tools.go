//go:build tools

// Package tools records the binaries build.sh builds from this module so that
// `go mod tidy` keeps their dependencies.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
	_ "helm.sh/helm/v4/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "sigs.k8s.io/kueue/cmd/kueue"
	_ "sigs.k8s.io/kwok/cmd/kwok"

	_ "rocmtrain.dev/testworld/cmd/kstatus"
)
