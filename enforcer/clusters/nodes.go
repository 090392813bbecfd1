package clusters

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Nodes is the Nodes resource of the workload cluster of CAPI Cluster key
// ("namespace/name"), reached through its kubeconfig Secret, read with
// management's config: for the commands that judge a workload cluster's
// Nodes once (check, audit), where serve keeps sessions (Set).
func Nodes(ctx context.Context, management *rest.Config, key string) (dynamic.ResourceInterface, error) {
	if management == nil {
		return nil, fmt.Errorf("cluster %s: no REST config to read its kubeconfig Secret with", key)
	}
	secrets, err := kubernetes.NewForConfig(management)
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	kubeconfig, err := ReadKubeconfig(ctx, secrets, key)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of Cluster %s (Secret %s): %w", key, KubeconfigSecret(key), err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for Cluster %s: %w", key, err)
	}
	return dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}), nil
}
