package facts

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// A watch that ends before its timeout, or reports an error, may have lost
// events; one the reflector stops, or that lasted its timeout, did not.
func TestAWatchEndingEarlyOrWithAnErrorIsAFailure(t *testing.T) {
	for name, tc := range map[string]struct {
		lasts time.Duration
		end   func(fake *watch.FakeWatcher, w watch.Interface)
		fails bool
	}{
		"server ended it early": {lasts: time.Minute, end: func(f *watch.FakeWatcher, _ watch.Interface) { f.Stop() }, fails: true},
		"error event": {lasts: time.Minute, end: func(f *watch.FakeWatcher, w watch.Interface) {
			go f.Error(&metav1.Status{Code: 410, Reason: metav1.StatusReasonExpired})
			<-w.ResultChan()
			w.Stop() // as the reflector does after an error
		}, fails: true},
		"server ended it at its timeout": {lasts: 50 * time.Millisecond, end: func(f *watch.FakeWatcher, _ watch.Interface) {
			time.Sleep(60 * time.Millisecond) // time under test: the watch lasts past its 50 ms timeout
			f.Stop()
		}},
		"the reflector stopped it": {lasts: time.Minute, end: func(_ *watch.FakeWatcher, w watch.Interface) { w.Stop() }},
	} {
		t.Run(name, func(t *testing.T) {
			var failures atomic.Int64
			fake := watch.NewFake()
			w := observe(fake, tc.lasts, func(error) { failures.Add(1) })
			tc.end(fake, w)
			// The watch's goroutine reports a failure before it closes the
			// channel: drained, the failures are all in.
			for range w.ResultChan() {
			}
			assert.Equal(t, tc.fails, failures.Load() > 0)
		})
	}
}
