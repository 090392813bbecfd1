// Package guard judges one Node: Guard.Decide answers a Node DELETE with the
// rule's decision over the facts (the library API), Finder gives a Node's
// orphan, release, ghost and registration verdicts, and StartEnforcer
// assembles the two over one cluster for the commands and serve.
//
// It must not serve HTTP or act on a Node: admission answers, nodes acts.
package guard
