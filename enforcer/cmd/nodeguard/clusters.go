package main

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kube"
)

func clustersCommand(code *int) *cobra.Command {
	var output, kubeconfig, kcContext string
	cmd := &cobra.Command{
		Use:   "clusters [-o text|json]",
		Short: "List every CAPI Cluster and whether nodeguard guards it (exit 0; 2 when one is unguarded for a fault; 1 on error)",
		Long: "Reads the Clusters of the management cluster and the ClusterGuard `nodeguard serve --fleet` writes beside each\n" +
			"(`kubectl get clusterguards -A` shows the same): mode, guarded (the configuration is as nodeguard wants it and a\n" +
			"dry-run Node delete reached its route), wired, CA current, the last proof and the reason when unguarded\n" +
			"(docs/operate.md, \"The fleet\").",
		Args: cobra.NoArgs,
		RunE: withCode(code, func(ctx context.Context, out io.Writer) (int, error) {
			c, err := kube.Connect(kubeconfig, kcContext)
			if err != nil {
				return 1, err
			}
			states, err := fleet.List(ctx, c)
			if err != nil {
				return 1, err
			}
			if err := fleet.Print(out, states, output, time.Now()); err != nil {
				return 1, err
			}
			if fleet.Unguarded(states) > 0 {
				return 2, nil
			}
			return 0, nil
		}),
	}
	f := cmd.Flags()
	f.StringVarP(&output, "output", "o", "text", "output format: text or json")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the management cluster")
	f.StringVar(&kcContext, "context", "", "kubeconfig context")
	return cmd
}
