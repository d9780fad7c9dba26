//go:build tools

// Package tools records the binary build.sh builds from this module (weed) so that
// `go mod tidy` keeps its dependencies.
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
