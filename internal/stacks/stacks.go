// Package stacks reads the goroutines of the test's own process, for tests
// that must see work queued or idle where nothing announces it (requests
// waiting on a shared decision, a loop waiting with nothing due). A wait
// built on it names the functions it looks for: when one is renamed, the
// wait times out with its message instead of passing.
package stacks

import (
	"runtime"
	"strings"
)

// All returns the stack of every goroutine, from one snapshot (the world
// stopped), one string each.
func All() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// Count counts the goroutines whose stacks hold every one of frames
// (functions' names).
func Count(frames ...string) int {
	count := 0
	for _, g := range All() {
		all := true
		for _, f := range frames {
			all = all && strings.Contains(g, f)
		}
		if all {
			count++
		}
	}
	return count
}
