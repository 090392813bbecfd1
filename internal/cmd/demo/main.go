// Command demo replays, on a real kube-apiserver and etcd on loopback with
// the real Cluster API machine controller, what nodeguard is for: a Node
// delete in the wrong order is denied (scenario 2), and when a Machine is
// deleted, CAPI's own order goes through the moment the InfraMachine is gone
// (scenario 1). It narrates what a person should see, then stops everything.
// Run it with `make demo`, which first builds the binaries it needs.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/internal/localcluster"
)

func main() {
	bin := flag.String("bin", os.Getenv("NODEGUARD_E2E_BIN"), "directory with kube-apiserver, etcd and kubectl (tests/e2e/tools/build.sh prints it)")
	flag.Parse()
	// envtest logs through controller-runtime; the narration is the output.
	ctrllog.SetLogger(logr.Discard())
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "demo: -bin is required; run `make demo`, which builds the binaries first")
		os.Exit(1)
	}
	if err := run(context.Background(), *bin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// node is the demo's Node, named as CAPD names a MachineDeployment's Node.
const node = "dev-md-0-x7k2p-abcde"

func run(ctx context.Context, bin string, out io.Writer) error {
	work, err := os.MkdirTemp("", "nodeguard-demo-")
	if err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	defer os.RemoveAll(work)
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }

	r := localcluster.Current()
	say("== Starting kube-apiserver and etcd on 127.0.0.1, with the Cluster API %s CRDs (%s, %s)", r.Name, r.CAPI, r.CAPD)
	certDir := filepath.Join(work, "apiserver")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return fmt.Errorf("certificate directory: %w", err)
	}
	env, err := localcluster.Environment(bin, certDir, r)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := env.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	defer func() {
		say("== Stopping the CAPI manager, nodeguard, kube-apiserver and etcd")
		_ = env.Stop()
	}()
	say("   ready in %s", time.Since(start).Round(100*time.Millisecond))
	cfg := localcluster.Config(env)

	url, probes, caPEM, stop, err := startNodeguard(ctx, cfg, work)
	if err != nil {
		return err
	}
	defer stop()
	say("== nodeguard serve is listening on %s (its decision log is not shown here)", url)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	vwc, err := admission.BuildWebhookConfig(admission.WebhookConfigOptions{URL: url, CABundle: caPEM})
	if err != nil {
		return err
	}
	if err := admission.ApplyWebhookConfig(ctx, dyn, vwc); err != nil {
		return err
	}
	say("   ValidatingWebhookConfiguration %q sends every Node DELETE to it (failurePolicy: Fail)", vwc.Name)
	if err := waitReady(ctx, probes, caPEM, 30*time.Second); err != nil {
		return err
	}
	say("   nodeguard reports ready: its informers have synced Machines and InfraMachines")

	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := localcluster.AdminKubeconfig(env, kubeconfig); err != nil {
		return err
	}
	capd, stopCAPI, err := startCAPI(ctx, env, bin, kubeconfig, work, say)
	if err != nil {
		return err
	}
	defer stopCAPI()
	if err := r.CAPIMachine(ctx, dyn, "default", "dev", node, localcluster.MachineOptions{}); err != nil {
		return err
	}
	if _, err := r.WaitLinked(ctx, dyn, kube, "default", node, time.Minute); err != nil {
		return err
	}
	say("   Machine default/%s: CAPD provisioned its DockerMachine, the kubelet registered Node %s,", node, node)
	say("   and CAPI linked them (status.nodeRef, the Node's cluster.x-k8s.io/machine annotation)")

	kubectl := func(args ...string) error {
		say("   $ kubectl %s", strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
		b, err := cmd.CombinedOutput()
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			say("   %s", line)
		}
		return err
	}

	say("\n== Scenario 2, the wrong order: someone deletes the Node while its host still runs")
	if err := kubectl("delete", "node", node); err == nil {
		return errors.New("the Node delete was allowed while its DockerMachine exists")
	}
	say("   -> denied: the Pod garbage collector would free the Pods' identities while the host may still run them.")

	say("\n== Scenario 1, CAPI's order: the Machine is deleted, and Cluster API's machine controller does the rest")
	capd.Hold(node) // the "container" takes a while to go: a window to try the wrong order again
	if err := kubectl("delete", "machine", node, "--wait=false"); err != nil {
		return fmt.Errorf("delete the Machine: %w", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		reason, err := r.DeletingReason(ctx, dyn, "default", node)
		return err == nil && reason == "WaitingForInfrastructureDeletion", nil
	}); err != nil {
		return fmt.Errorf("CAPI did not reach WaitingForInfrastructureDeletion: %w", err)
	}
	say("   CAPI cordoned and drained the Node, deleted DockerMachine default/%s and waits for it to go", node)
	say("   (Machine condition Deleting: WaitingForInfrastructureDeletion). Meanwhile someone deletes the Node:")
	if err := kubectl("delete", "node", node); err == nil {
		return errors.New("the Node delete was allowed while its DockerMachine was still being deleted")
	}
	say("   -> still denied: being deleted is not gone.")
	capd.Let(node)
	getNode := func(ctx context.Context) error {
		_, err := kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err
	}
	nodeGone, err := localcluster.WaitGone(ctx, time.Minute, getNode)
	if err != nil {
		return fmt.Errorf("CAPI did not delete Node %s: %w", node, err)
	}
	dmGone, _ := capd.Deleted(node)
	say("   CAPD removed its finalizer: the DockerMachine is gone. CAPI then deleted the Node through nodeguard,")
	say("   %s later: nodeguard re-reads the candidates from the API server, so a stale \"present\" in its cache",
		nodeGone.Sub(dmGone.At).Round(time.Millisecond))
	say("   does not deny CAPI's one attempt (a stale \"gone\" would not allow either).")
	getMachine := func(ctx context.Context) error {
		_, err := dyn.Resource(r.GVR("cluster.x-k8s.io", "machines")).Namespace("default").Get(ctx, node, metav1.GetOptions{})
		return err
	}
	if _, err := localcluster.WaitGone(ctx, time.Minute, getMachine); err != nil {
		return fmt.Errorf("Machine %s: %w", node, err)
	}
	say("   Machine default/%s is gone: CAPI's order, end to end, with nothing left behind.\n", node)
	return nil
}

// startCAPI creates cluster default/dev with a control-plane Machine (CAPI
// deletes a Node only while another control-plane Machine exists), starts
// CAPD (played here) and the real CAPI manager, and returns CAPD and a stop
// function. On a failure the tail of the manager's log is printed.
func startCAPI(ctx context.Context, env *envtest.Environment, bin, kubeconfig, work string, say func(string, ...any)) (*localcluster.CAPD, func(), error) {
	r := localcluster.Current()
	cfg := localcluster.Config(env)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("client: %w", err)
	}
	// CAPI reaches the workload cluster (here the same API server) through
	// the Cluster's kubeconfig Secret, as kubernetes-admin.
	user, err := env.AddUser(envtest.User{Name: "kubernetes-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("add kubernetes-admin: %w", err)
	}
	workload, err := user.KubeConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes-admin kubeconfig: %w", err)
	}
	if err := r.CAPICluster(ctx, dyn, kube, "default", "dev", workload); err != nil {
		return nil, nil, err
	}
	capdCtx, stopCAPD := context.WithCancel(ctx)
	capd := r.StartCAPD(capdCtx, dyn, kube, "default")
	logPath := filepath.Join(work, "capi-manager.log")
	log, err := os.Create(logPath)
	if err != nil {
		stopCAPD()
		return nil, nil, fmt.Errorf("CAPI manager log: %w", err)
	}
	stopManager, err := localcluster.StartCAPIManager(bin, kubeconfig, work, log)
	if err != nil {
		stopCAPD()
		log.Close()
		return nil, nil, err
	}
	stop := func() { stopManager(); stopCAPD(); log.Close() }
	say("\n== Starting the Cluster API %s core manager, unmodified, out of cluster (%s)", r.Name, strings.TrimPrefix(r.CAPI, "sigs.k8s.io/"))
	say("   Only what cannot run here is played: CAPD (no containers) and the kubelet (it registers Nodes)")
	if err := r.CAPIMachine(ctx, dyn, "default", "dev", "dev-cp-0", localcluster.MachineOptions{ControlPlane: true}); err != nil {
		stop()
		return nil, nil, err
	}
	if _, err := r.WaitLinked(ctx, dyn, kube, "default", "dev-cp-0", time.Minute); err != nil {
		b, _ := os.ReadFile(logPath)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		say("   last lines of the CAPI manager's log:\n%s", strings.Join(lines[max(0, len(lines)-30):], "\n"))
		stop()
		return nil, nil, fmt.Errorf("%w (CAPD: %v)", err, capd.Err())
	}
	say("   Cluster default/dev runs; its control-plane Machine dev-cp-0 is linked to its Node")
	return capd, stop, nil
}

// startNodeguard runs `nodeguard serve` in this process with a throwaway
// certificate and returns its URL, its probes' URL, the CA bundle and a stop
// function.
func startNodeguard(ctx context.Context, cfg *rest.Config, work string) (string, string, []byte, func(), error) {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		return "", "", nil, nil, fmt.Errorf("certificate: %w", err)
	}
	certFile, keyFile := filepath.Join(work, "tls.crt"), filepath.Join(work, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return "", "", nil, nil, fmt.Errorf("write certificate: %w", err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", nil, nil, fmt.Errorf("write key: %w", err)
	}
	clients, err := kube.FromConfig(cfg)
	if err != nil {
		return "", "", nil, nil, err
	}
	// The decision log would interleave with the narration; keep it out.
	probes := make(chan net.Addr, 1)
	url, stop, err := localcluster.Serve(ctx, clients, serve.Options{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile,
		HealthProbeBindAddress: "127.0.0.1:0", SideListening: func(_ string, a net.Addr) { probes <- a }},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return "", "", nil, nil, err
	}
	return url, "http://" + (<-probes).String(), certPEM, stop, nil
}

// waitReady polls nodeguard's /readyz (on its probe port) until it answers 200.
func waitReady(ctx context.Context, url string, caPEM []byte, timeout time.Duration) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	last := "no answer"
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		if err != nil {
			return false, fmt.Errorf("readyz: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = strings.TrimSpace(string(b))
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("nodeguard was not ready after %s: %s (%w)", timeout, last, err)
	}
	return nil
}
