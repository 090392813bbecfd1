package localcluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// CAPICluster creates a CAPI Cluster in the management cluster with what
// CAPI needs to reach its workload cluster: the `<name>-kubeconfig` Secret
// (labeled, since the manager caches only labeled Secrets) holding
// workloadKubeconfig. With only spec.controlPlaneEndpoint, CAPI marks the
// Cluster's infrastructure provisioned itself.
func (r Release) CAPICluster(ctx context.Context, dyn dynamic.Interface, kube kubernetes.Interface, namespace, name string, workloadKubeconfig []byte) error {
	if _, err := kube.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name + "-kubeconfig",
			Labels: map[string]string{"cluster.x-k8s.io/cluster-name": name}},
		Type: "cluster.x-k8s.io/secret",
		Data: map[string][]byte{"value": workloadKubeconfig},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Secret %s-kubeconfig: %w", name, err)
	}
	_, err := Apply(ctx, dyn, r.GVR("cluster.x-k8s.io", "clusters"), map[string]any{
		"apiVersion": "cluster.x-k8s.io/" + r.Version, "kind": "Cluster",
		"metadata": map[string]any{"namespace": namespace, "name": name},
		"spec":     map[string]any{"controlPlaneEndpoint": map[string]any{"host": "127.0.0.1", "port": int64(6443)}},
	})
	return err
}

// MachineOptions shape a Machine made by CAPIMachine.
type MachineOptions struct {
	// ControlPlane labels the Machine as a control-plane Machine. CAPI deletes
	// a Node only while another control-plane Machine exists, so every
	// cluster here has one.
	ControlPlane bool
	// NodeDeletionTimeoutSeconds, when set, is spec.deletion's. CAPI's
	// defaulting webhook sets 10 in production; without that webhook (out of
	// cluster, as here) the field stays unset and CAPI retries forever.
	NodeDeletionTimeoutSeconds *int64
}

// CAPIMachine creates a Machine of cluster namespace/cluster and its
// DockerMachine, as a user (or a control-plane provider) would. The DockerMachine
// is empty: CAPD provisions it (see StartCAPD); CAPI sets the Machine's
// providerID and nodeRef and annotates the Node.
func (r Release) CAPIMachine(ctx context.Context, dyn dynamic.Interface, namespace, cluster, name string, opts MachineOptions) error {
	labels := map[string]any{"cluster.x-k8s.io/cluster-name": cluster}
	if _, err := Apply(ctx, dyn, r.GVR("infrastructure.cluster.x-k8s.io", "dockermachines"), map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/" + r.Version, "kind": "DockerMachine",
		"metadata": map[string]any{"namespace": namespace, "name": name, "labels": labels},
		"spec":     map[string]any{},
	}); err != nil {
		return err
	}
	machineLabels := map[string]any{"cluster.x-k8s.io/cluster-name": cluster}
	if opts.ControlPlane {
		machineLabels["cluster.x-k8s.io/control-plane"] = ""
	}
	spec := map[string]any{
		"clusterName":       cluster,
		"bootstrap":         map[string]any{"dataSecretName": name + "-bootstrap"},
		"infrastructureRef": map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name},
	}
	if opts.NodeDeletionTimeoutSeconds != nil {
		spec["deletion"] = map[string]any{"nodeDeletionTimeoutSeconds": *opts.NodeDeletionTimeoutSeconds}
	}
	_, err := Apply(ctx, dyn, r.GVR("cluster.x-k8s.io", "machines"), map[string]any{
		"apiVersion": "cluster.x-k8s.io/" + r.Version, "kind": "Machine",
		"metadata": map[string]any{"namespace": namespace, "name": name, "labels": machineLabels},
		"spec":     spec,
	})
	return err
}

// WaitLinked waits until CAPI has linked Machine namespace/name to its Node
// (status.nodeRef set, the Node annotated with the Machine's name) and
// returns the Node's name.
func (r Release) WaitLinked(ctx context.Context, dyn dynamic.Interface, nodes kubernetes.Interface, namespace, name string, timeout time.Duration) (string, error) {
	var node string
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		m, err := dyn.Resource(r.GVR("cluster.x-k8s.io", "machines")).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		if node, _, _ = unstructured.NestedString(m.Object, "status", "nodeRef", "name"); node == "" {
			last = errors.New("no status.nodeRef yet")
			return false, nil
		}
		n, err := nodes.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		if n.Annotations["cluster.x-k8s.io/machine"] != name {
			last = fmt.Errorf("Node %s not annotated yet", node)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return "", fmt.Errorf("CAPI did not link Machine %s/%s to its Node: %w (last: %v)", namespace, name, err, last)
	}
	return node, nil
}

// DeletingReason is the reason of Machine namespace/name's v1beta2 Deleting
// condition, "" without one.
func (r Release) DeletingReason(ctx context.Context, dyn dynamic.Interface, namespace, name string) (string, error) {
	m, err := dyn.Resource(r.GVR("cluster.x-k8s.io", "machines")).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get Machine %s/%s: %w", namespace, name, err)
	}
	conds, _, _ := unstructured.NestedSlice(m.Object, "status", "conditions")
	for _, c := range conds {
		if cm, _ := c.(map[string]any); cm["type"] == "Deleting" {
			reason, _ := cm["reason"].(string)
			return reason, nil
		}
	}
	return "", nil
}

// WaitGone polls get until it reports NotFound and returns when it did.
func WaitGone(ctx context.Context, timeout time.Duration, get func(context.Context) error) (time.Time, error) {
	var at time.Time
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		last = get(ctx)
		at = time.Now()
		return apierrors.IsNotFound(last), nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("still there: %w (last: %v)", err, last)
	}
	return at, nil
}
