package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	certutil "k8s.io/client-go/util/cert"
)

// CAPIManagerBinary is the Cluster API core manager (machine, MachineSet and
// Cluster controllers) that tests/e2e/tools/build.sh builds from
// tests/e2e/tools/capi, the release Current names.
const CAPIManagerBinary = "capi-manager"

// capdFinalizer is the finalizer CAPD puts on a DockerMachine: it holds the
// object until the container is gone.
const capdFinalizer = "dockermachine.infrastructure.cluster.x-k8s.io"

// StartCAPIManager runs the real Cluster API core manager out of cluster
// against the API server of kubeconfig, as FIELD-NOTES.md describes, until
// stop is called. Its output goes to log. It needs no
// cert-manager: its webhook server cannot be turned off, so it gets a
// throwaway certificate in workDir and a free port, and nothing registers it
// with the API server (objects are written at v1beta2, no conversion needed).
func StartCAPIManager(binDir, kubeconfig, workDir string, log io.Writer) (stop func(), err error) {
	certDir := filepath.Join(workDir, "capi-webhook-certs")
	if _, err := servingCert(certDir); err != nil {
		return nil, fmt.Errorf("CAPI webhook: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(binDir, CAPIManagerBinary),
		"--kubeconfig", kubeconfig,
		"--leader-elect=false", "--diagnostics-address=0", "--health-addr=0",
		"--webhook-port", strconv.Itoa(port), "--webhook-cert-dir", certDir,
		// MachinePools, topology and runtime extensions need objects and
		// servers this harness does not have; the machine controller needs none.
		"--feature-gates=MachinePool=false,ClusterTopology=false,RuntimeSDK=false",
		"--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields")
	cmd.Stdout, cmd.Stderr = log, log
	stop, err = start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start the CAPI manager: %w", err)
	}
	return stop, nil
}

// start starts cmd and returns a function that stops it: SIGTERM, then a
// kill if it has not exited 15 s later. stop may be called more than once.
func start(cmd *exec.Cmd) (stop func(), err error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}, nil
}

// servingCert writes a throwaway serving certificate for 127.0.0.1 into dir
// as tls.crt and tls.key (the names controller-runtime servers read) and
// returns the certificate PEM, which carries its CA: a webhook's CA bundle.
func servingCert(dir string) ([]byte, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cert dir: %w", err)
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write certificate: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write key: %w", err)
	}
	return certPEM, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

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
