//go:build tools

// Package tools pins the program this module builds (see ../build.sh).
package tools

import _ "helm.sh/helm/v4/cmd/helm"
