// Command demo replays, on a real kube-apiserver and etcd on loopback, what
// nodeguard is for: a Node delete in the wrong order is denied (scenario 2),
// and CAPI's order is allowed the moment the InfraMachine is gone (scenario
// 1). It narrates what a person should see, then stops everything. Run it
// with `make demo`, which first builds the binaries it needs.
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
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nodeguard/nodeguard/enforcer/live"
	"github.com/nodeguard/nodeguard/enforcer/serve"
	"github.com/nodeguard/nodeguard/enforcer/webhookconfig"
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
		say("== Stopping nodeguard, kube-apiserver and etcd")
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
	vwc, err := webhookconfig.Build(webhookconfig.Options{URL: url, CABundle: caPEM})
	if err != nil {
		return err
	}
	if err := webhookconfig.Apply(ctx, kube, vwc); err != nil {
		return err
	}
	say("   ValidatingWebhookConfiguration %q sends every Node DELETE to it (failurePolicy: Fail)", vwc.Name)
	if err := waitReady(ctx, probes, caPEM, 30*time.Second); err != nil {
		return err
	}
	say("   nodeguard reports ready: its informers have synced Machines and InfraMachines")

	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	say("\n== What CAPD creates for one Machine of cluster default/dev:")
	if err := r.CAPDMachine(ctx, dyn, node, true); err != nil {
		return err
	}
	say("   Node %s, DockerMachine default/%s (with CAPD's finalizer), Machine default/%s linking both", node, node, node)

	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := localcluster.AdminKubeconfig(env, kubeconfig); err != nil {
		return err
	}
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

	say("\n== Scenario 1, CAPI's order: the Machine controller deletes the DockerMachine first")
	dockerMachines := dyn.Resource(r.GVR("infrastructure.cluster.x-k8s.io", "dockermachines")).Namespace("default")
	if err := dockerMachines.Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete DockerMachine: %w", err)
	}
	say("   DockerMachine default/%s is being deleted; CAPD's finalizer holds it while the container is torn down", node)
	if err := kubectl("delete", "node", node); err == nil {
		return errors.New("the Node delete was allowed while its DockerMachine was still being deleted")
	}
	say("   -> still denied: being deleted is not gone.")
	dm, err := dockerMachines.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get DockerMachine: %w", err)
	}
	dm.SetFinalizers(nil)
	if _, err := dockerMachines.Update(ctx, dm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("remove the finalizer: %w", err)
	}
	gone := time.Now()
	say("   CAPD removes its finalizer: the DockerMachine is gone; the Machine controller now deletes the Node")
	if err := kubectl("delete", "node", node); err != nil {
		return fmt.Errorf("the Node delete was denied after its DockerMachine was gone: %w", err)
	}
	say("   -> allowed, %s after the DockerMachine disappeared (kubectl's start included): nodeguard re-reads",
		time.Since(gone).Round(time.Millisecond))
	say("      the candidates from the API server, so neither a stale \"present\" nor a stale \"gone\" in its cache decides.\n")
	return nil
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
	clients, err := live.FromConfig(cfg)
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
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("readyz: %w", err)
		}
		resp, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = strings.TrimSpace(string(b))
		} else {
			last = err.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("nodeguard was not ready after %s: %s", timeout, last)
}
