package kube

import (
	"context"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodeguard/nodeguard/enforcer/record"
)

// ClusterNodes is the Nodes resource of the workload cluster of CAPI Cluster key
// ("namespace/name"): Dynamic's.
func ClusterNodes(ctx context.Context, management *rest.Config, key string) (dynamic.ResourceInterface, error) {
	dyn, err := ClusterDynamic(ctx, management, key)
	if err != nil {
		return nil, err
	}
	return dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}), nil
}

// ClusterDynamic is a client of the workload cluster of CAPI Cluster key
// ("namespace/name"), with its kubeconfig's credentials, read through the
// management cluster of management: for the commands that reach a workload
// cluster once (check, audit, cleanup, webhook-config), where serve keeps
// connections (Set).
func ClusterDynamic(ctx context.Context, management *rest.Config, key string) (dynamic.Interface, error) {
	if management == nil {
		return nil, fmt.Errorf("cluster %s: no REST config to read its kubeconfig Secret with", key)
	}
	secrets, err := kubernetes.NewForConfig(management)
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	cfg, err := ConnectCluster(ctx, secrets, key)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for Cluster %s: %w", key, err)
	}
	return dyn, nil
}

// ClusterKeys are CAPI Clusters of the cluster of c, "namespace/name", sorted:
// one, checked to exist, or all ("").
func ClusterKeys(ctx context.Context, c Clients, one, selector string) ([]string, error) {
	mapping, err := RESTMapping(c.Mapper, ClusterKind)
	if err != nil {
		return nil, fmt.Errorf("find Cluster API's Clusters: %w", err)
	}
	res := c.Dynamic.Resource(mapping.Resource)
	if one != "" {
		ns, name, err := record.SplitKey("cluster", one)
		if err != nil {
			return nil, fmt.Errorf("--cluster: %w", err)
		}
		if _, err := res.Namespace(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("get Cluster %s: %w", one, err)
		}
		return []string{one}, nil
	}
	list, err := res.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list Clusters: %w", err)
	}
	keys := make([]string, 0, len(list.Items))
	for _, cl := range list.Items {
		keys = append(keys, cl.GetNamespace()+"/"+cl.GetName())
	}
	sort.Strings(keys)
	return keys, nil
}
