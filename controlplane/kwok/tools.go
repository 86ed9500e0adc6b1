//go:build tools

// Package tools pins the program this module builds (see ../build.sh).
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
