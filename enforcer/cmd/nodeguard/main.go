// Command nodeguard keeps Nodes from being deleted while an InfraMachine
// linked to them still exists.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/nodeguard/nodeguard/enforcer/check"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	code := check.ExitAllowed
	root := &cobra.Command{
		Use:           "nodeguard",
		Short:         "Deny deleting a Node while an InfraMachine linked to it still exists",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(checkCommand(&code))
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "nodeguard:", err)
		return check.ExitError
	}
	return code
}

func checkCommand(code *int) *cobra.Command {
	var opts check.Options
	cmd := &cobra.Command{
		Use:   "check --node NAME [-f PATH ...]",
		Short: "Say whether deleting a Node would be allowed (exit 0 allowed, 2 denied, 1 error)",
		Long: "With -f, judge offline: the files or directories of manifests are the whole inventory and hold the Node.\n" +
			"Without -f, judge live against the cluster of the kubeconfig, reading objects fresh from the API server.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := check.Run(cmd.Context(), opts, cmd.OutOrStdout())
			*code = c
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Node, "node", "", "name of the Node to judge (required)")
	f.StringArrayVarP(&opts.Files, "filename", "f", nil, "manifest file or directory (YAML, JSON, Lists); repeatable")
	f.StringVar(&opts.Cluster, "cluster", "", "only count Machines of this CAPI Cluster, NAMESPACE/NAME")
	f.StringVar(&opts.User, "user", "", "user deleting the Node (for exemptions)")
	f.StringArrayVar(&opts.Groups, "group", nil, "group of that user; repeatable")
	f.StringVar(&opts.Constraint, "constraint", "", "K8sNodeGuard Constraint file to take parameters from (default: the rule's defaults)")
	f.StringVarP(&opts.Output, "output", "o", "text", "output format: text or json")
	f.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig file (live mode)")
	f.StringVar(&opts.Context, "context", "", "kubeconfig context (live mode)")
	_ = cmd.MarkFlagRequired("node")
	return cmd
}
