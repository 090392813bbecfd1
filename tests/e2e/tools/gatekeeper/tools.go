//go:build tools

// Package tools pins the Gatekeeper manager the e2e suite runs.
package tools

import _ "github.com/open-policy-agent/gatekeeper/v3"
