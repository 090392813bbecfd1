// Package rule runs nodeguard's Rego and holds what it answers: the engine
// (one compiled policy, one prepared query per entry point), the decision
// and its reasons, the link model the policy declares, the signed bundle a
// policy may come from, the enforcement actions, and the binary's version.
//
// It must not reach a cluster or cache objects, and it holds no rule fact of
// its own: defaults, links and the orphan grace are read from policies/, where
// the rule lives (the decision's reasons are still listed here too, to check a
// policy's answer and to label metrics).
package rule
