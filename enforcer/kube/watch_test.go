package kube

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func configMap(name, value string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": "ns", "name": name,
			"managedFields": []any{map[string]any{"manager": "kubectl"}}},
		"data": map[string]any{"k": value}}}
	return u
}

// The watch tells each change of its object with the object as it is now,
// nil once it is deleted, and keeps it without its managed fields.
func TestAnObjectWatchTellsEachChange(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"}, configMap("mine", "1"))
	var mu sync.Mutex
	var told []string
	o, err := WatchObject(ObjectOptions{Client: client, Resource: configMaps, Namespace: "ns", Name: "mine",
		Changed: func(obj *unstructured.Unstructured) {
			mu.Lock()
			defer mu.Unlock()
			if obj == nil {
				told = append(told, "gone")
				return
			}
			v, _, _ := unstructured.NestedString(obj.Object, "data", "k")
			told = append(told, v)
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go o.Run(ctx)
	require.Eventually(t, o.Synced, 5*time.Second, 5*time.Millisecond)
	got, ok := o.Get()
	require.True(t, ok)
	assert.Empty(t, got.GetManagedFields(), "managed fields are not kept")
	_, err = client.Resource(configMaps).Namespace("ns").Update(ctx, configMap("mine", "2"), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(c, []string{"1", "2"}, told)
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, client.Resource(configMaps).Namespace("ns").Delete(ctx, "mine", metav1.DeleteOptions{}))
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(c, []string{"1", "2", "gone"}, told)
	}, 5*time.Second, 5*time.Millisecond)
	_, ok = o.Get()
	assert.False(t, ok)
}

// A list that fails is told to Failed (the cluster's health counts it).
func TestAnObjectWatchTellsItsFailures(t *testing.T) {
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{configMaps: "ConfigMapList"})
	client.PrependReactor("list", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	failed := make(chan error, 10)
	o, err := WatchObject(ObjectOptions{Client: client, Resource: configMaps, Namespace: "ns", Name: "mine",
		Failed: func(err error) {
			select {
			case failed <- err:
			default:
			}
		}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go o.Run(ctx)
	select {
	case err := <-failed:
		assert.ErrorContains(t, err, "connection refused")
	case <-time.After(5 * time.Second):
		t.Fatal("a failed list was not told")
	}
	assert.False(t, o.Synced())
}
