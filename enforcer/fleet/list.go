package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nodeguard/nodeguard/enforcer/kube"
)

// ReasonNotReported is shown for a Cluster the reconciler has not reported
// (the fleet reconciler is off, or has not reached it yet).
const ReasonNotReported = "not-reported"

// List is every Cluster of the management cluster c with the State the
// fleet reconciler reported for it in its ClusterGuard, sorted by key.
func List(ctx context.Context, c kube.Clients) ([]State, error) {
	keys, err := kube.ClusterKeys(ctx, c, "", "")
	if err != nil {
		return nil, err
	}
	reported, err := ReadStatus(ctx, c.Dynamic)
	if err != nil {
		return nil, err
	}
	out := make([]State, 0, len(keys))
	for _, key := range keys {
		st, ok := reported[key]
		if !ok {
			st = State{Cluster: key, Reason: ReasonNotReported,
				Message: "nodeguard serve --fleet has not written this Cluster's ClusterGuard"}
		}
		out = append(out, st)
	}
	return out, nil
}

// Unguarded counts the states that are not guarded for a fault (not for an
// opt-out, a deselection or a deletion).
func Unguarded(states []State) int {
	n := 0
	for _, s := range states {
		if !s.Guarded && !Excluded(s.Reason) {
			n++
		}
	}
	return n
}

// Print writes states as a table, or as JSON (output "json").
func Print(out io.Writer, states []State, output string, now time.Time) error {
	switch output {
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(states)
	case "", "text":
	default:
		return fmt.Errorf("-o %q: want text or json", output)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CLUSTER\tMODE\tGUARDED\tWIRED\tCA CURRENT\tLAST PROOF\tREASON")
	for _, s := range states {
		proof := "never"
		if !s.LastProof.IsZero() {
			proof = now.Sub(s.LastProof).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Cluster, dash(s.Mode), yes(s.Guarded), yes(s.Wired), yes(s.CACurrent), proof, dash(s.Reason))
	}
	return w.Flush()
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
