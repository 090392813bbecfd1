package fleet

import (
	"bytes"
	"cmp"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodeguard/nodeguard/enforcer/admission"
	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/record"
)

// Each workload cluster's API server can present a client certificate of
// its own to nodeguard's route for its Cluster, so no cluster's credentials
// speak for another's: nodeguard issues it from a CA of its own
// (--fleet-client-ca-cert-file, --fleet-client-ca-key-file), its common
// name the Cluster's key, into a Secret beside the Cluster, in the form the
// API server's AdmissionConfiguration reads (a kubeconfig whose one user is
// named for the webhook's host:port), and renews it a third of its life
// before it expires; a cluster route accepts only the certificate issued
// for its own Cluster (admission.WebhookOptions.ClusterIdentities).

// ClientCertSecret is the Secret holding the Cluster key's webhook client
// kubeconfig (key "value"), in the Cluster's namespace.
func ClientCertSecret(key string) string { return key + clientCertSuffix }

const clientCertSuffix = "-nodeguard-webhook-client"

// DefaultClientCertValidity is the life of each issued certificate: the
// workload API server reads the file when it starts, so a renewal reaches
// it at the control plane's next rollout, which a third of a year leaves
// room for.
const DefaultClientCertValidity = 365 * 24 * time.Hour

// Issuer issues the workload API servers' webhook client certificates.
type Issuer struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
	// user names the kubeconfig's user: the webhook's host:port, which the
	// API server looks its webhook credentials up by.
	user     string
	validity time.Duration
}

// NewIssuer reads the CA (PEM certificate and key) that signs the client
// certificates; url is the fleet's, whose host:port names the kubeconfig's
// user.
func NewIssuer(certFile, keyFile, fleetURL string, validity time.Duration) (*Issuer, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("webhook client CA: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("webhook client CA key: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("webhook client CA %s: no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("webhook client CA %s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("webhook client CA %s: not a CA certificate", certFile)
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("webhook client CA key %s: %w", keyFile, err)
	}
	u, err := url.Parse(fleetURL)
	if err != nil || u.Hostname() == "" {
		return nil, fmt.Errorf("--fleet-url %q: want https://HOST[:PORT]", fleetURL)
	}
	kube.SetDefault(&validity, DefaultClientCertValidity)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &Issuer{cert: cert, key: key, pool: pool, user: net.JoinHostPort(u.Hostname(), cmp.Or(u.Port(), "443")), validity: validity}, nil
}

func parseKey(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
	}
	if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	return nil, errors.New("not a PKCS#8, EC or PKCS#1 private key")
}

// Kubeconfig issues a new key and certificate for the Cluster key and
// returns them as the kubeconfig the workload API server reads.
func (i *Issuer) Kubeconfig(key string, now time.Time) ([]byte, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("client key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: admission.ClusterClientName(key), Organization: []string{"nodeguard.io"}},
		NotBefore:    now.Add(-5 * time.Minute), NotAfter: now.Add(i.validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, i.cert, &priv.PublicKey, i.key)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("client key: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.AuthInfos[i.user] = &clientcmdapi.AuthInfo{
		ClientCertificateData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		ClientKeyData:         pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	return clientcmd.Write(*cfg)
}

// current says whether kubeconfig holds a certificate this issuer issued
// for the Cluster key, under its user, with more than a third of its life
// left.
func (i *Issuer) current(kubeconfig []byte, key string, now time.Time) bool {
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil || len(cfg.AuthInfos) != 1 || cfg.AuthInfos[i.user] == nil {
		return false
	}
	block, _ := pem.Decode(cfg.AuthInfos[i.user].ClientCertificateData)
	if block == nil {
		return false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil || cert.Subject.CommonName != admission.ClusterClientName(key) || !bytes.Equal(cert.RawIssuer, i.cert.RawSubject) {
		return false
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: i.pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return false
	}
	life := cert.NotAfter.Sub(cert.NotBefore)
	return cert.NotAfter.Sub(now) > life/3
}

var secrets = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// ClientCerts keeps each Cluster's webhook client Secret in the management
// cluster.
type ClientCerts struct {
	Issuer *Issuer
	// Secrets reads the Secrets (GET); Writer applies them (create, patch).
	Secrets kubernetes.Interface
	Writer  dynamic.Interface
}

// keep issues the Cluster's client certificate where its Secret is missing,
// holds another, or is due for renewal; it says whether it wrote.
func (c *ClientCerts) keep(ctx context.Context, key string, meta kube.ClusterMeta) (bool, error) {
	ns, name, err := record.SplitKey("cluster", key)
	if err != nil {
		return false, err
	}
	have, err := c.Secrets.CoreV1().Secrets(ns).Get(ctx, name+clientCertSuffix, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, fmt.Errorf("read Secret %s: %w", ClientCertSecret(key), err)
	case c.Issuer.current(have.Data["value"], key, time.Now()):
		return false, nil
	}
	kubeconfig, err := c.Issuer.Kubeconfig(key, time.Now())
	if err != nil {
		return false, err
	}
	secret := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + clientCertSuffix,
			Labels: map[string]string{"app.kubernetes.io/name": "nodeguard", kube.ManagedByLabel: kube.Owner, "cluster.x-k8s.io/cluster-name": name}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"value": kubeconfig},
	}
	if meta.UID != "" {
		// It goes with its Cluster.
		secret.OwnerReferences = []metav1.OwnerReference{{APIVersion: meta.APIVersion, Kind: kube.ClusterKind.Kind, Name: name, UID: meta.UID}}
	}
	o, err := kube.OwnedFrom(secrets, secret)
	if err != nil {
		return false, err
	}
	if _, err := kube.ApplyOwned(ctx, c.Writer, o); err != nil {
		return false, fmt.Errorf("write Secret %s: %w", ClientCertSecret(key), err)
	}
	return true, nil
}
