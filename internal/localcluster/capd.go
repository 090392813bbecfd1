package localcluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// capdFinalizer is the finalizer CAPD puts on a DockerMachine: it holds the
// object until the container is gone.
const capdFinalizer = "dockermachine.infrastructure.cluster.x-k8s.io"

// CAPD plays Cluster API's Docker infrastructure provider and the kubelet,
// the parts of a cluster this harness cannot run: for each DockerMachine of
// its namespace it "starts a container" (finalizer, spec.providerID
// docker:////NAME, status.initialization.provisioned) and registers its Node
// in the workload cluster, Ready; for each DockerMachine being deleted it
// "removes the container" (the Node goes NotReady, as the node lifecycle
// controller would mark it) and drops its finalizer, unless the test holds
// it. Everything else is the real CAPI manager's doing.
type CAPD struct {
	gvr      dynamic.ResourceInterface
	nodes    kubernetes.Interface
	interval time.Duration

	mu      sync.Mutex
	held    map[string]bool
	deleted map[string]Deletion
	lastErr error
}

// Deletion is what CAPD saw when it let a DockerMachine go.
type Deletion struct {
	// At is when the DockerMachine's finalizer was removed: the moment it is
	// gone for CAPI.
	At time.Time
	// NodeExisted says the Node was still there at that moment: CAPI's order.
	NodeExisted bool
}

// StartCAPD runs CAPD for the DockerMachines of namespace in infra, with
// Nodes in nodes, until ctx ends.
func (r Release) StartCAPD(ctx context.Context, infra dynamic.Interface, nodes kubernetes.Interface, namespace string) *CAPD {
	c := &CAPD{
		gvr:      infra.Resource(r.GVR("infrastructure.cluster.x-k8s.io", "dockermachines")).Namespace(namespace),
		nodes:    nodes,
		interval: 100 * time.Millisecond,
		held:     map[string]bool{},
		deleted:  map[string]Deletion{},
	}
	go func() {
		t := time.NewTicker(c.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.setErr(c.reconcile(ctx))
			}
		}
	}()
	return c
}

// Hold keeps DockerMachine name's container (and so its finalizer) while it
// is being deleted, until Let.
func (c *CAPD) Hold(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held[name] = true
}

// Let lets a held DockerMachine go.
func (c *CAPD) Let(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.held, name)
}

// Deleted reports when CAPD let DockerMachine name go, if it did.
func (c *CAPD) Deleted(name string) (Deletion, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.deleted[name]
	return d, ok
}

// Err is the last error of a pass, nil after a clean one: for a test's
// failure message.
func (c *CAPD) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastErr
}

func (c *CAPD) setErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr = err
}

func (c *CAPD) isHeld(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[name]
}

// reconcile is one pass over the DockerMachines; a conflict with CAPI's own
// writes is retried on the next pass.
func (c *CAPD) reconcile(ctx context.Context) error {
	list, err := c.gvr.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list DockerMachines: %w", err)
	}
	var errs []error
	for i := range list.Items {
		dm := &list.Items[i]
		if dm.GetDeletionTimestamp() != nil {
			errs = append(errs, c.remove(ctx, dm))
		} else {
			errs = append(errs, c.provision(ctx, dm))
		}
	}
	return errors.Join(errs...)
}

func (c *CAPD) provision(ctx context.Context, dm *unstructured.Unstructured) error {
	name := dm.GetName()
	pid := "docker:////" + name
	if !hasFinalizer(dm) {
		dm.SetFinalizers(append(dm.GetFinalizers(), capdFinalizer))
		if err := unstructured.SetNestedField(dm.Object, pid, "spec", "providerID"); err != nil {
			return err
		}
		updated, err := c.gvr.Update(ctx, dm, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("start container for DockerMachine %s: %w", name, err)
		}
		dm = updated
	}
	if provisioned, _, _ := unstructured.NestedBool(dm.Object, "status", "initialization", "provisioned"); provisioned {
		return nil
	}
	// The kubelet registers the Node before CAPD reports the machine
	// provisioned, so CAPI finds it by providerID on its first look.
	if err := c.register(ctx, name, pid); err != nil {
		return err
	}
	if err := unstructured.SetNestedField(dm.Object, true, "status", "initialization", "provisioned"); err != nil {
		return err
	}
	if _, err := c.gvr.UpdateStatus(ctx, dm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("mark DockerMachine %s provisioned: %w", name, err)
	}
	return nil
}

// register creates the Node a kubelet would, Ready.
func (c *CAPD) register(ctx context.Context, name, pid string) error {
	node, err := c.nodes.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{ProviderID: pid},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("register Node %s: %w", name, err)
	}
	return c.setReady(ctx, node, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status")
}

func (c *CAPD) setReady(ctx context.Context, node *corev1.Node, status corev1.ConditionStatus, reason, msg string) error {
	now := metav1.Now()
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: reason, Message: msg,
		LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := c.nodes.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("Node %s Ready=%s: %w", node.Name, status, err)
	}
	return nil
}

func (c *CAPD) remove(ctx context.Context, dm *unstructured.Unstructured) error {
	name := dm.GetName()
	if !hasFinalizer(dm) || c.isHeld(name) {
		return nil
	}
	node, err := c.nodes.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	existed := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get Node %s: %w", name, err)
	}
	if existed && isReady(node) {
		// The container is gone, so its kubelet stops posting status.
		if err := c.setReady(ctx, node, corev1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status."); err != nil {
			return err
		}
	}
	dm.SetFinalizers(slices.DeleteFunc(dm.GetFinalizers(), func(f string) bool { return f == capdFinalizer }))
	if _, err := c.gvr.Update(ctx, dm, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the finalizer of DockerMachine %s: %w", name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleted[name] = Deletion{At: time.Now(), NodeExisted: existed}
	return nil
}

func isReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasFinalizer(dm *unstructured.Unstructured) bool {
	return slices.Contains(dm.GetFinalizers(), capdFinalizer)
}
