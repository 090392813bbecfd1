// Package testnodes builds Nodes for tests as a kubelet and Cluster API
// leave them, so tests of what is kept of a Node read realistic ones.
package testnodes

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Created is every Node's creationTimestamp and condition transition time.
var Created = metav1.NewTime(time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC))

// Real returns Node i of cluster prod-1: most of it is never read (labels,
// capacity, addresses, images); its conditions are MemoryPressure,
// DiskPressure and Ready, in that order.
func Real(i int) *corev1.Node {
	name := fmt.Sprintf("ip-10-0-%d-%d.ec2.internal", i/250, i%250)
	n := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: "6a1f3c2e-8d4b-4c1a-9e2f-0b1c2d3e4f50", ResourceVersion: "123456789", CreationTimestamp: Created,
			Labels: map[string]string{"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "m6i.2xlarge", "topology.kubernetes.io/zone": "us-east-1a"},
			Annotations: map[string]string{"cluster.x-k8s.io/cluster-name": "prod-1", "cluster.x-k8s.io/cluster-namespace": "fleet",
				"cluster.x-k8s.io/machine": fmt.Sprintf("prod-1-md-0-abcde-%05d", i), "cluster.x-k8s.io/owner-kind": "MachineSet",
				"node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: corev1.NodeSpec{ProviderID: fmt.Sprintf("aws:///us-east-1a/i-%017x", i), PodCIDR: "192.168.1.0/24"},
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodeReady} {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: c, Status: corev1.ConditionFalse,
			LastHeartbeatTime: Created, LastTransitionTime: Created, Reason: "KubeletHasSufficient" + string(c), Message: "kubelet is posting status"})
	}
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.1.2"}, {Type: corev1.NodeHostName, Address: name}}
	for j := range 20 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{fmt.Sprintf("registry.k8s.io/image-%d:v1.%d", j, j)}, SizeBytes: 1 << 27})
	}
	return n
}
