// Package rule runs nodeguard's Rego and holds what it answers: the engine
// (one compiled policy, one prepared query per entry point), the decision
// and its reasons, the link model the policy declares, the signed bundle a
// policy may come from, the enforcement actions, and the binary's version.
//
// It must not reach a cluster or cache objects, and it holds no rule fact of
// its own: defaults, links and reasons are read from policies/, where the
// rule lives.
package rule
