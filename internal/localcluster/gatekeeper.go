package localcluster

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/internal/testpki"
)

// GatekeeperModule is the Gatekeeper the e2e tools build
// (tests/e2e/tools/gatekeeper/go.mod).
const GatekeeperModule = "github.com/open-policy-agent/gatekeeper/v3@v3.23.1"

// Gatekeeper is a running Gatekeeper manager.
type Gatekeeper struct {
	// Stop ends it.
	Stop func()
	// Applied is kubectl's last output of applying the constraints.
	Applied string
	// CAFile holds the CA of Gatekeeper's certificate, which Gatekeeper also
	// presents as its client certificate when it calls an external data
	// provider.
	CAFile string
}

// StartGatekeeper runs Gatekeeper's manager out of cluster against env's
// API server, as FIELD-NOTES.md describes, with Gatekeeper's own validating
// webhook configuration patched by repo's constraints/webhook component
// (DELETE, fail closed) and pointed at it, then applies the kustomization
// repo/constraints (constraints/ or constraints/external-data/) with kubectl
// as a user would, again until the Constraint's kind exists. Its output goes
// to log.
func StartGatekeeper(ctx context.Context, env *envtest.Environment, binDir, repo, constraints, workDir string, log io.Writer) (*Gatekeeper, error) {
	gk, err := ModuleDir(GatekeeperModule)
	if err != nil {
		return nil, err
	}
	if _, err := envtest.InstallCRDs(env.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(gk, "charts/gatekeeper/crds")}}); err != nil {
		return nil, fmt.Errorf("install Gatekeeper's CRDs: %w", err)
	}
	kube, err := kubernetes.NewForConfig(Config(env))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	// A Gatekeeper started before on this API server left it.
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gatekeeper-system"}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace gatekeeper-system: %w", err)
	}
	// tls.crt and tls.key, the names Gatekeeper reads, for server and client
	// authentication as Gatekeeper's own rotator issues them when external
	// data is on; ca.crt is the webhook's CA bundle and a provider's client CA.
	certDir := filepath.Join(workDir, "gatekeeper-certs")
	ca, err := testpki.NewCA(certDir)
	if err == nil {
		err = ca.WriteTLS(certDir)
	}
	if err != nil {
		return nil, fmt.Errorf("Gatekeeper: %w", err)
	}
	caPEM := ca.PEM()
	kubeconfig := filepath.Join(workDir, "gatekeeper.kubeconfig")
	if err := AdminKubeconfig(env, kubeconfig); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	healthPort, err := freePort()
	if err != nil {
		return nil, err
	}
	apiCache := filepath.Join(workDir, "gatekeeper-api-cache")
	if err := os.MkdirAll(apiCache, 0o700); err != nil {
		return nil, fmt.Errorf("Gatekeeper API cache dir: %w", err)
	}
	cmd := exec.Command(filepath.Join(binDir, "gatekeeper"),
		"--kubeconfig", kubeconfig,
		"--debug-use-fake-pod", "--disable-cert-rotation", "--cert-dir", certDir,
		"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--health-addr", fmt.Sprintf("127.0.0.1:%d", healthPort), "--metrics-addr", "0",
		"--operation=webhook", "--operation=audit", "--operation=status", "--operation=generate",
		// audit fails every run without an existing --api-cache-dir.
		"--audit-interval=2", "--api-cache-dir", apiCache, "--shutdown-delay=0", "--log-level=INFO")
	cmd.Env = append(os.Environ(), "POD_NAMESPACE=gatekeeper-system")
	cmd.Stdout, cmd.Stderr = log, log
	stop, err := start(cmd)
	if err != nil {
		return nil, fmt.Errorf("start Gatekeeper: %w", err)
	}

	vwc, err := gatekeeperWebhookConfig(gk, filepath.Join(repo, "constraints/webhook/kustomization.yaml"))
	if err != nil {
		stop()
		return nil, err
	}
	for i := range vwc.Webhooks {
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, *vwc.Webhooks[i].ClientConfig.Service.Path)
		vwc.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
	}
	if _, err := kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		stop()
		return nil, fmt.Errorf("create Gatekeeper's webhook configuration: %w", err)
	}
	var out []byte
	err = wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		var kerr error
		out, kerr = exec.CommandContext(ctx, filepath.Join(binDir, "kubectl"), "--kubeconfig", kubeconfig,
			"apply", "-k", filepath.Join(repo, constraints)).CombinedOutput()
		return kerr == nil, nil
	})
	if err != nil {
		stop()
		return nil, fmt.Errorf("kubectl apply -k %s: %w: %s", constraints, err, out)
	}
	return &Gatekeeper{Stop: stop, Applied: string(out), CAFile: filepath.Join(certDir, "ca.crt")}, nil
}

// gatekeeperWebhookConfig is the ValidatingWebhookConfiguration of
// Gatekeeper's deploy/gatekeeper.yaml with the kustomize component at
// componentFile applied.
func gatekeeperWebhookConfig(gk, componentFile string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	all, err := os.ReadFile(filepath.Join(gk, "deploy/gatekeeper.yaml"))
	if err != nil {
		return nil, fmt.Errorf("read Gatekeeper's deploy/gatekeeper.yaml: %w", err)
	}
	var vwc string
	for _, doc := range strings.Split(string(all), "\n---\n") {
		if strings.Contains(doc, "\nkind: ValidatingWebhookConfiguration\n") {
			vwc = doc
		}
	}
	if vwc == "" {
		return nil, fmt.Errorf("deploy/gatekeeper.yaml has no ValidatingWebhookConfiguration")
	}
	component, err := os.ReadFile(componentFile)
	if err != nil {
		return nil, fmt.Errorf("read the webhook component: %w", err)
	}
	fs := filesys.MakeFsInMemory()
	for path, data := range map[string]string{
		"/app/vwc.yaml":                   vwc,
		"/app/webhook/kustomization.yaml": string(component),
		"/app/kustomization.yaml":         "resources: [vwc.yaml]\ncomponents: [webhook]\n",
	} {
		if err := fs.WriteFile(path, []byte(data)); err != nil {
			return nil, fmt.Errorf("kustomize: %w", err)
		}
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/app")
	if err != nil {
		return nil, fmt.Errorf("kustomize the webhook component: %w", err)
	}
	if len(m.Resources()) != 1 {
		return nil, fmt.Errorf("kustomize the webhook component: want 1 object, got %d", len(m.Resources()))
	}
	raw, err := m.Resources()[0].AsYAML()
	if err != nil {
		return nil, fmt.Errorf("kustomize the webhook component: %w", err)
	}
	out := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := yaml.UnmarshalStrict(raw, out); err != nil {
		return nil, fmt.Errorf("decode the patched webhook configuration: %w", err)
	}
	return out, nil
}
