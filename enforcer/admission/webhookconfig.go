// This file writes the ValidatingWebhookConfiguration that sends
// Node deletes to `nodeguard serve`, and installs it into a workload cluster
// through the CAPI kubeconfig Secret of the management cluster.

package admission

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/nodeguard/nodeguard/enforcer/kube"
	"github.com/nodeguard/nodeguard/enforcer/record"
)

// WebhookConfigGVR is the ValidatingWebhookConfiguration resource.
var WebhookConfigGVR = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}

// ClusterAnnotation, on a configuration nodeguard keeps in a workload
// cluster, names the CAPI Cluster ("namespace/name") it routes to.
const ClusterAnnotation = "nodeguard.io/cluster"

// Name is the configuration's name, WebhookName the Node-delete webhook's,
// RegistrationWebhookName the registration webhook's (WebhookConfigOptions.Registrations).
const (
	Name                    = "nodeguard"
	WebhookName             = "node-delete.nodeguard.io"
	RegistrationWebhookName = "node-registration.nodeguard.io"
	// TimeoutSeconds leaves the server's 4s request deadline room to answer.
	TimeoutSeconds = 5
)

// WebhookRules are the RBAC rules for keeping the configuration named Name: to
// an identity of nodeguard's in a workload cluster (kube.EnsureIdentity).
// Create cannot be limited to a name (RBAC does not know it before), so
// that identity can create any configuration; everything else only Name.
func WebhookRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{WebhookConfigGVR.Group}, Resources: []string{WebhookConfigGVR.Resource}, Verbs: []string{"create"}},
		{APIGroups: []string{WebhookConfigGVR.Group}, Resources: []string{WebhookConfigGVR.Resource}, ResourceNames: []string{Name},
			Verbs: []string{"get", "list", "watch", "patch", "update", "delete"}},
	}
}

// WebhookConfigOptions say where the webhook is and which Machines count.
type WebhookConfigOptions struct {
	// URL is the server's base URL (https); the route is appended.
	URL string
	// Service, "namespace/name", is the alternative to URL for a server in
	// the same cluster as the API server (self-hosted).
	Service string
	// CABundle is the PEM CA that signed the server's certificate.
	CABundle []byte
	// Cluster, "namespace/name", routes to /validate/clusters/NS/NAME: only
	// that CAPI Cluster's Machines count.
	Cluster string
	// Webhook are the webhook's own settings; zero: Fail, 5 s, every Node.
	Webhook WebhookSettings
	// Registrations adds the registration webhook (ghost protection deny):
	// Node CREATEs, and the UPDATEs that set spec.providerID, go to
	// /register (/register/clusters/NS/NAME), in an entry of its own with
	// failurePolicy Ignore and a short timeout, so joining a cluster never
	// depends on nodeguard.
	Registrations bool
}

// RegistrationTimeoutSeconds bounds what a Node's registration waits for
// nodeguard; past it, the API server admits it (failurePolicy Ignore).
const RegistrationTimeoutSeconds = 3

// RegistersCondition is the registration webhook's match condition: a Node
// CREATE, or an UPDATE that sets spec.providerID (an external
// cloud-controller-manager sets it after the kubelet registered); every
// other Node update stays off nodeguard's path.
const RegistersCondition = "request.operation == 'CREATE' || " +
	"((!has(oldObject.spec) || !has(oldObject.spec.providerID) || oldObject.spec.providerID == '') && " +
	"has(object.spec) && has(object.spec.providerID) && object.spec.providerID != '')"

// WebhookSettings are what the API server does with the webhook: the failure
// policy, the timeout, and which Node deletes it sends at all. Nodes are
// cluster-scoped, so an object selector on Node labels and CEL match
// conditions are what narrow it (no namespace selector applies).
type WebhookSettings struct {
	// FailurePolicy is Fail unless set. Ignore admits every Node delete
	// while nodeguard cannot be reached: the rule then holds only while it
	// answers.
	FailurePolicy admissionregistrationv1.FailurePolicyType
	// TimeoutSeconds is TimeoutSeconds unless set (1-30); keep serve's
	// --request-timeout below it.
	TimeoutSeconds int32
	// ObjectSelector is a label selector on the Node ("" : every Node).
	ObjectSelector string
	// MatchConditions are CEL conditions a request must meet to be sent.
	MatchConditions []admissionregistrationv1.MatchCondition
}

// webhookFields checks the settings and returns them as the webhook's
// fields, defaults filled in as the API server would fill them.
func (s WebhookSettings) webhookFields() (admissionregistrationv1.FailurePolicyType, int32, *metav1.LabelSelector, error) {
	policy := cmp.Or(s.FailurePolicy, admissionregistrationv1.Fail)
	if policy != admissionregistrationv1.Fail && policy != admissionregistrationv1.Ignore {
		return "", 0, nil, fmt.Errorf("failure policy %q: want Fail or Ignore", policy)
	}
	timeout := cmp.Or(s.TimeoutSeconds, TimeoutSeconds)
	if timeout < 1 || timeout > 30 {
		return "", 0, nil, fmt.Errorf("timeout %ds: the API server takes 1 to 30", timeout)
	}
	selector := &metav1.LabelSelector{}
	if s.ObjectSelector != "" {
		var err error
		if selector, err = metav1.ParseToLabelSelector(s.ObjectSelector); err != nil {
			return "", 0, nil, fmt.Errorf("object selector %q: %w", s.ObjectSelector, err)
		}
	}
	for _, c := range s.MatchConditions {
		if c.Name == "" || c.Expression == "" {
			return "", 0, nil, fmt.Errorf("match condition %q: a name and an expression are required", c.Name)
		}
	}
	return policy, timeout, selector, nil
}

// BuildWebhookConfig returns the configuration: Node DELETE only, failurePolicy Fail
// (opts.Webhook changes that), and with opts.Registrations the
// registration webhook.
func BuildWebhookConfig(opts WebhookConfigOptions) (*admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	client, err := clientConfig(opts, "/validate", "the API server")
	if err != nil {
		return nil, err
	}
	fail, timeout, selector, err := opts.Webhook.webhookFields()
	if err != nil {
		return nil, err
	}
	meta := metav1.ObjectMeta{Name: Name, Labels: map[string]string{"app.kubernetes.io/name": "nodeguard", kube.ManagedByLabel: "nodeguard"}}
	if opts.Cluster != "" {
		meta.Annotations = map[string]string{ClusterAnnotation: opts.Cluster}
	}
	nodes := func(ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{Operations: ops,
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}, Scope: new(admissionregistrationv1.ClusterScope)}}}
	}
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: meta,
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         WebhookName,
			ClientConfig: client,
			// Set, though empty, as the API server would default them: the
			// stored configuration then equals this one field for field, so
			// any foreign change to it shows (kube.Holds).
			NamespaceSelector: &metav1.LabelSelector{},
			ObjectSelector:    selector,
			MatchConditions:   opts.Webhook.MatchConditions,
			Rules:             nodes(admissionregistrationv1.Delete),
			FailurePolicy:     &fail,
			MatchPolicy:       new(admissionregistrationv1.Equivalent),
			// A denied delete records an Event (a side effect), never on a dry run.
			SideEffects:             new(admissionregistrationv1.SideEffectClassNoneOnDryRun),
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if !opts.Registrations {
		return cfg, nil
	}
	register, err := clientConfig(opts, "/register", "the API server")
	if err != nil {
		return nil, err
	}
	cfg.Webhooks = append(cfg.Webhooks, admissionregistrationv1.ValidatingWebhook{
		Name:              RegistrationWebhookName,
		ClientConfig:      register,
		NamespaceSelector: &metav1.LabelSelector{},
		ObjectSelector:    &metav1.LabelSelector{},
		MatchConditions:   []admissionregistrationv1.MatchCondition{{Name: "registers", Expression: RegistersCondition}},
		// nodes, not nodes/status: a kubelet's status reports never come here.
		Rules:                   nodes(admissionregistrationv1.Create, admissionregistrationv1.Update),
		FailurePolicy:           new(admissionregistrationv1.Ignore),
		MatchPolicy:             new(admissionregistrationv1.Equivalent),
		SideEffects:             new(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          new(int32(RegistrationTimeoutSeconds)),
		AdmissionReviewVersions: []string{"v1"},
	})
	return cfg, nil
}

// clientConfig checks opts' CA bundle and says where who reaches route (a
// webhook's or the provider's) for opts' Cluster: route/clusters/NS/NAME, or
// route itself without one.
func clientConfig(opts WebhookConfigOptions, route, who string) (admissionregistrationv1.WebhookClientConfig, error) {
	client := admissionregistrationv1.WebhookClientConfig{CABundle: opts.CABundle}
	if len(opts.CABundle) == 0 {
		return client, errors.New("--ca-bundle-file is required: the API server must trust nodeguard's serving certificate")
	}
	if _, err := Certificates(opts.CABundle); err != nil {
		return client, fmt.Errorf("CA bundle: %w", err)
	}
	path := route
	if opts.Cluster != "" {
		ns, name, err := record.SplitKey("--cluster", opts.Cluster)
		if err != nil {
			return client, err
		}
		path += "/clusters/" + ns + "/" + name
	}
	switch {
	case opts.URL != "" && opts.Service != "":
		return client, errors.New("give --url or --service, not both")
	case opts.URL != "":
		u, err := url.Parse(opts.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return client, fmt.Errorf("--url %q: want https://HOST[:PORT][/PREFIX]", opts.URL)
		}
		u.Path = strings.TrimSuffix(u.Path, "/") + path
		client.URL = new(u.String())
	case opts.Service != "":
		ns, name, err := record.SplitKey("--service", opts.Service)
		if err != nil {
			return client, err
		}
		client.Service = &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name, Path: &path}
	default:
		return client, fmt.Errorf("--url (or --service) is required: where %s reaches nodeguard serve", who)
	}
	return client, nil
}

// Certificates are the certificates of a PEM bundle, each re-encoded as
// PEM alone: other blocks are skipped, a certificate that does not parse is
// an error, and so is a bundle without one.
func Certificates(bundle []byte) ([][]byte, error) {
	var certs [][]byte
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, err
		}
		certs = append(certs, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes}))
	}
	if len(certs) == 0 {
		return nil, errors.New("holds no PEM certificate")
	}
	return certs, nil
}

// WebhookConfigYAML renders the configuration for kubectl apply.
func WebhookConfigYAML(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) ([]byte, error) {
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("render ValidatingWebhookConfiguration: %w", err)
	}
	return out, nil
}

// WebhookConfigObject is the configuration as kube.ApplyOwned writes it.
func WebhookConfigObject(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) (kube.Owned, error) {
	return kube.OwnedFrom(WebhookConfigGVR, cfg)
}

// ApplyWebhookConfig writes the configuration into the cluster of client (server-side
// apply, nodeguard's field manager), replacing it whole where another
// manager added fields to it.
func ApplyWebhookConfig(ctx context.Context, client dynamic.Interface, cfg *admissionregistrationv1.ValidatingWebhookConfiguration) error {
	o, err := WebhookConfigObject(cfg)
	if err != nil {
		return err
	}
	_, _, err = kube.RestoreOwned(ctx, client, o, "webhooks")
	return err
}

// InstallTarget is the client of the cluster a configuration goes to: the workload
// cluster of the CAPI Cluster named by cluster, through its kubeconfig
// Secret in the management cluster mgmt (kube.ConnectCluster, the one way there),
// connected by connect (dynamic.NewForConfig); with no cluster, self, the
// management cluster's own (self-hosted). It says where that is.
func InstallTarget(ctx context.Context, mgmt kubernetes.Interface, self dynamic.Interface, cluster string,
	connect func(*rest.Config) (dynamic.Interface, error)) (dynamic.Interface, string, error) {
	if cluster == "" {
		return self, "the cluster of the kubeconfig", nil
	}
	if _, _, err := record.SplitKey("--cluster", cluster); err != nil {
		return nil, "", err
	}
	cfg, err := kube.ConnectCluster(ctx, mgmt, cluster)
	if err != nil {
		return nil, "", err
	}
	client, err := connect(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("connect to workload cluster %s: %w", cluster, err)
	}
	return client, "workload cluster " + cluster, nil
}
