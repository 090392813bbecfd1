// Package cli implements the judging commands of the nodeguard binary:
// check, audit, orphans, ghosts and cleanup, each judging files or a live
// cluster as serve would and printing text or JSON with a documented exit
// code.
//
// It must not run a server: `nodeguard serve` is the serve package.
package cli
