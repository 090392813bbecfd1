// Package cli implements the commands of the nodeguard binary that are not
// serve: check, audit, orphans and ghosts, which judge files or a live cluster
// as serve would and print text or JSON with a documented exit code, and
// cleanup, which removes what serve installed.
//
// It must not run a server: `nodeguard serve` is the serve package.
package cli
