package main

import (
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	// `nodeguard SUB ...` up to the end of the code span, a comment or a
	// pipe: the flags named there are SUB's.
	invocation = regexp.MustCompile("nodeguard (check|serve|webhook-config|orphans|clusters|version)\\b([^`#|]*)")
	flagName   = regexp.MustCompile(`(?:^|[\s\[(])(--[a-z0-9][a-z0-9-]*)`)
	// An inline code span that is a flag alone (`--x`, `--x=v`, `--x v`).
	loneFlag = regexp.MustCompile("`(--[a-z0-9][a-z0-9-]*)(?:[= ][^`]*)?`")
)

// Other tools' flags the docs name as lone code spans.
var otherTools = map[string]bool{
	"--set": true, "--set-file": true, "--reuse-values": true, "--dry-run": true, "--wait": true, // helm, kubectl
	"--server-side": true, "--force-conflicts": true, "--kubeconfig": true, "--context": true,
	"--capabilities": true, "--coverage": true, "--strict": true, "--bench": true, "--benchtime": true, "--args": true,
	"--enable-external-data": true, // Gatekeeper's
	"--event-ttl":            true, // kube-apiserver's
	"--target-namespace":     true, // clusterctl's
}

// Every flag a doc names on a nodeguard command exists on that command, and
// every flag a doc names alone exists on some nodeguard command (or is
// another tool's, listed above): docs that name a flag the code does not
// have send an operator to an error.
func TestDocsNameOnlyFlagsThatExist(t *testing.T) {
	code := 0
	root := rootCommand(&code, io.Discard)
	flags := map[string]map[string]bool{}
	any := map[string]bool{"--help": true}
	for _, c := range root.Commands() {
		set := map[string]bool{"--help": true}
		c.Flags().VisitAll(func(f *pflag.Flag) { set["--"+f.Name] = true; any["--"+f.Name] = true })
		flags[c.Name()] = set
	}
	files, err := filepath.Glob("../../../docs/*.md")
	require.NoError(t, err)
	files = append(files, "../../../README.md")
	var missing []string
	named := 0
	for _, file := range files {
		raw, err := os.ReadFile(file)
		require.NoError(t, err)
		for i, line := range strings.Split(string(raw), "\n") {
			where := filepath.Base(file) + ":" + strconv.Itoa(i+1)
			for _, m := range invocation.FindAllStringSubmatch(line, -1) {
				for _, f := range flagName.FindAllStringSubmatch(m[2], -1) {
					named++
					if !flags[m[1]][f[1]] {
						missing = append(missing, where+": nodeguard "+m[1]+" has no "+f[1])
					}
				}
			}
			for _, f := range loneFlag.FindAllStringSubmatch(line, -1) {
				named++
				if !any[f[1]] && !otherTools[f[1]] {
					missing = append(missing, where+": no nodeguard command has "+f[1])
				}
			}
		}
	}
	sort.Strings(missing)
	assert.Empty(t, missing, "flags the docs name that do not exist:\n%s", strings.Join(missing, "\n"))
	assert.Greater(t, named, 50, "the docs name flags: the patterns still find them")
}
