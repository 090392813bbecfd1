// Package localcluster runs a real kube-apiserver and etcd on loopback with
// the real Cluster API CRDs, and creates what CAPI and CAPD create for a
// Machine. The e2e suite and `make demo` share it; the binaries come from
// tests/e2e/tools/build.sh.
package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/fleet"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/serve"
)

// Release is a Cluster API release whose CRDs the API server gets: the real
// ones, from the pinned modules, labeled with the contract as the release's
// kustomization labels them (version discovery reads those labels).
type Release struct {
	Name       string
	CAPI, CAPD string // module@version
	Core       string // the core CRDs' directory in the CAPI module
	// CoreCRDs and CAPDCRDs are the CRD files installed, by name in their
	// module's directory.
	CoreCRDs, CAPDCRDs []string
	Contract           map[string]string
	Version            string // the version Machines and DockerMachines are written in
}

// capdCRDs is where CAPD's CRDs live in the CAPI test module.
const capdCRDs = "infrastructure/docker/config/crd/bases"

// Current is Cluster API v1.14: it stores v1beta2 and still serves v1beta1.
// Its CRDs include everything the CAPI core manager (tests/e2e/tools/capi,
// the same release) watches, so the real controllers can run against it.
func Current() Release {
	return Release{Name: "v1.14", CAPI: "sigs.k8s.io/cluster-api@v1.14.2", CAPD: "sigs.k8s.io/cluster-api/test@v1.14.0",
		Core: "core/config/crd/bases", Version: "v1beta2",
		CoreCRDs: []string{
			"cluster.x-k8s.io_machines.yaml", "cluster.x-k8s.io_clusters.yaml", "cluster.x-k8s.io_machinepools.yaml",
			"cluster.x-k8s.io_machinesets.yaml", "cluster.x-k8s.io_machinedeployments.yaml",
			"cluster.x-k8s.io_machinehealthchecks.yaml", "cluster.x-k8s.io_machinedrainrules.yaml",
			"addons.cluster.x-k8s.io_clusterresourcesets.yaml", "addons.cluster.x-k8s.io_clusterresourcesetbindings.yaml",
		},
		CAPDCRDs: []string{
			"infrastructure.cluster.x-k8s.io_dockermachines.yaml", "infrastructure.cluster.x-k8s.io_dockermachinepools.yaml",
			"infrastructure.cluster.x-k8s.io_dockermachinetemplates.yaml",
		},
		Contract: map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1", "cluster.x-k8s.io/v1beta2": "v1beta2"}}
}

// Older is Cluster API v1.10: it serves and stores only v1beta1.
func Older() Release {
	return Release{Name: "v1.10", CAPI: "sigs.k8s.io/cluster-api@v1.10.10", CAPD: "sigs.k8s.io/cluster-api/test@v1.10.10",
		Core: "config/crd/bases", Version: "v1beta1",
		CoreCRDs: []string{"cluster.x-k8s.io_machines.yaml", "cluster.x-k8s.io_clusters.yaml", "cluster.x-k8s.io_machinepools.yaml"},
		CAPDCRDs: []string{"infrastructure.cluster.x-k8s.io_dockermachines.yaml", "infrastructure.cluster.x-k8s.io_dockermachinepools.yaml"},
		Contract: map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1"}}
}

// GVR is a resource of group at the release's version.
func (r Release) GVR(group, resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: group, Version: r.Version, Resource: resource}
}

// Nodes is the core Node resource.
func Nodes() schema.GroupVersionResource {
	return schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
}

// ModuleDir downloads module@version (if needed) and returns its directory.
func ModuleDir(module string) (string, error) {
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	return info.Dir, nil
}

// CRDs reads the release's core CRDs and CAPD's (CAPD's carry the contract
// label), and adds nodeguard's ClusterGuard.
func (r Release) CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	capi, err := ModuleDir(r.CAPI)
	if err != nil {
		return nil, err
	}
	capd, err := ModuleDir(r.CAPD)
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	read := func(dir string, names []string, labels map[string]string) error {
		for _, name := range names {
			path := filepath.Join(dir, name)
			data, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("read CRD: %w", err)
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := yaml.UnmarshalStrict(data, crd); err != nil {
				return fmt.Errorf("decode CRD %s: %w", path, err)
			}
			crd.Labels = labels
			out = append(out, crd)
		}
		return nil
	}
	if err := read(filepath.Join(capi, r.Core), r.CoreCRDs, nil); err != nil {
		return nil, err
	}
	if err := read(filepath.Join(capd, capdCRDs), r.CAPDCRDs, r.Contract); err != nil {
		return nil, err
	}
	// nodeguard's own, where the fleet writes its status.
	return append(out, fleet.ClusterGuardCRD()), nil
}

// Environment is an envtest environment over the binaries in binDir with the
// release's CRDs, not yet started. A fixed certDir keeps the serving
// certificate, and so every client's trust, across an API server restart.
func Environment(binDir, certDir string, r Release) (*envtest.Environment, error) {
	crds, err := r.CRDs()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{BinaryAssetsDirectory: binDir, CRDInstallOptions: envtest.CRDInstallOptions{CRDs: crds}}
	api := env.ControlPlane.GetAPIServer()
	api.CertDir = certDir
	// Without a bound, a graceful stop waits for every open watch (a running
	// nodeguard's informers) to end on its own.
	api.Configure().Set("shutdown-watch-termination-grace-period", "2s")
	return env, nil
}

// Apply creates obj and then, if it has one, writes its status.
func Apply(ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, obj map[string]any) (*unstructured.Unstructured, error) {
	u := &unstructured.Unstructured{Object: obj}
	ns := u.GetNamespace()
	created, err := client.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	if status, ok := obj["status"]; ok {
		created.Object["status"] = status
		created, err = client.Resource(gvr).Namespace(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			return nil, fmt.Errorf("update status of %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return created, nil
}

// CAPDMachine creates what CAPD makes for one Machine of cluster default/dev:
// the Node, the DockerMachine (with CAPD's finalizer when finalizer is set)
// and the Machine linking both, by nodeRef, providerID and the Node's
// annotations, in the release's API version.
func (r Release) CAPDMachine(ctx context.Context, client dynamic.Interface, name string, finalizer bool) error {
	pid := "docker:////" + name
	if _, err := Apply(ctx, client, Nodes(), map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "annotations": map[string]any{
			"cluster.x-k8s.io/cluster-name": "dev", "cluster.x-k8s.io/cluster-namespace": "default", "cluster.x-k8s.io/machine": name}},
		"spec": map[string]any{"providerID": pid},
	}); err != nil {
		return err
	}
	meta := map[string]any{"namespace": "default", "name": name, "labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"}}
	if finalizer {
		meta["finalizers"] = []any{"dockermachine.infrastructure.cluster.x-k8s.io"}
	}
	if _, err := Apply(ctx, client, r.GVR("infrastructure.cluster.x-k8s.io", "dockermachines"), map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/" + r.Version, "kind": "DockerMachine", "metadata": meta,
		"spec": map[string]any{"providerID": pid},
	}); err != nil {
		return err
	}
	// The two shapes of infrastructureRef: v1beta1 names the API version and
	// namespace, v1beta2 only the group.
	ref := map[string]any{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name}
	nodeRef := map[string]any{"name": name}
	if r.Version == "v1beta1" {
		ref = map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachine", "name": name, "namespace": "default"}
		nodeRef = map[string]any{"apiVersion": "v1", "kind": "Node", "name": name}
	}
	_, err := Apply(ctx, client, r.GVR("cluster.x-k8s.io", "machines"), map[string]any{
		"apiVersion": "cluster.x-k8s.io/" + r.Version, "kind": "Machine",
		"metadata": map[string]any{"namespace": "default", "name": name, "labels": map[string]any{"cluster.x-k8s.io/cluster-name": "dev"}},
		"spec": map[string]any{"clusterName": "dev", "providerID": pid,
			"bootstrap":         map[string]any{"dataSecretName": name + "-bootstrap"},
			"infrastructureRef": ref},
		"status": map[string]any{"nodeRef": nodeRef},
	})
	return err
}

// AdminKubeconfig writes a kubeconfig for an admin user of env's API server
// to path.
func AdminKubeconfig(env *envtest.Environment, path string) error {
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("add admin user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("admin kubeconfig: %w", err)
	}
	return os.WriteFile(path, kubeconfig, 0o600)
}

// Config is env's admin config, quiet about CAPD v1.14's deprecation of
// DockerMachine (DevMachine replaces it), which would bury all other output.
func Config(env *envtest.Environment) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	return cfg
}

// Serve runs `nodeguard serve` in this process until ctx ends or stop is
// called, and returns its https URL once it listens. stop waits for it to
// finish and may be called more than once.
func Serve(ctx context.Context, clients kube.Clients, opts serve.Options, log *slog.Logger) (url string, stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve.RunWith(ctx, clients, opts, log, func(a net.Addr) { addr <- a })
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	select {
	case a := <-addr:
		return "https://" + a.String(), stop, nil
	case err := <-done:
		cancel()
		return "", func() {}, fmt.Errorf("nodeguard serve: %w", err)
	}
}

// AuthenticateToWebhooks makes env's API server present the client
// certificate certPEM/keyPEM to every admission webhook it calls, as a
// kubeadm control plane does through --admission-control-config-file (a
// WebhookAdmissionConfiguration whose kubeconfig names the webhook's host,
// here "*", any). Call it before Start; dir holds the files.
func AuthenticateToWebhooks(env *envtest.Environment, dir string, certPEM, keyPEM []byte) error {
	kc, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Config",
		"users": []any{map[string]any{"name": "*", "user": map[string]any{
			"client-certificate-data": certPEM, "client-key-data": keyPEM}}},
	})
	if err != nil {
		return fmt.Errorf("webhook client kubeconfig: %w", err)
	}
	return AuthenticateToWebhooksWith(env, dir, kc)
}

// AuthenticateToWebhooksWith has env's API server read the credentials it
// presents to webhooks from kubeconfig (its users named for the webhooks'
// host:port, or *), as an AdmissionConfiguration on a control plane does.
func AuthenticateToWebhooksWith(env *envtest.Environment, dir string, kc []byte) error {
	kubeconfig := filepath.Join(dir, "webhook-client.kubeconfig")
	admission := filepath.Join(dir, "admission-config.yaml")
	cfg := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %q
`, kubeconfig)
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", kubeconfig, err)
	}
	if err := os.WriteFile(admission, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", admission, err)
	}
	env.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", admission)
	return nil
}
