package rule

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"time"

	"github.com/fsnotify/fsnotify"
)

// settle is how long file events must stop before a reload: writers (cp,
// kubelet's ConfigMap and Secret updates) touch the file several times.
const settle = 200 * time.Millisecond

// WatchBundle reloads the bundle into running whenever the file (or, for a
// directory bundle, anything under it) changes, until ctx is done. A new
// bundle that fails LoadBundle, or whose default parameters differ from the running
// ones (the informers were started from those: a restart is needed), is not
// used: running keeps its policy and reloaded is called with the error.
// reloaded, when set, is called with nil after each successful swap.
func WatchBundle(ctx context.Context, opts BundleOptions, running *Engine, log *slog.Logger, reloaded func(error)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch bundle: %w", err)
	}
	defer w.Close()
	// The parent directory sees the file replaced by a rename (atomic
	// writes, kubelet's ..data symlink swap), which a watch on the file loses.
	if err := addTree(w, opts.Path); err != nil {
		return err
	}
	var (
		timer <-chan time.Time
		last  [sha256.Size]byte // of the tarball last tried; a directory is always reloaded
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			log.Warn("bundle watch error", "error", err)
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Create) {
				// A new directory in a directory bundle: watch it too.
				if info, err := os.Stat(ev.Name); err == nil && info.IsDir() {
					_ = addTree(w, ev.Name)
				}
			}
			timer = time.After(settle)
		case <-timer:
			timer = nil
			if b, err := os.ReadFile(opts.Path); err == nil {
				sum := sha256.Sum256(b)
				if sum == last {
					continue // another file of the directory changed, not the bundle
				}
				last = sum
			}
			err := reload(ctx, opts, running)
			if err != nil {
				log.Error("bundle reload refused; keeping the running policy", "error", err, "revision", running.Policy().Revision)
			} else {
				log.Info("bundle reloaded", "revision", running.Policy().Revision)
			}
			if reloaded != nil {
				reloaded(err)
			}
		}
	}
}

func reload(ctx context.Context, opts BundleOptions, running *Engine) error {
	next, err := LoadBundle(ctx, opts)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(next.DefaultParameters(), running.DefaultParameters()) {
		return fmt.Errorf("bundle %s (revision %q): its default parameters differ from the running policy's; "+
			"the informers were started from those, so restart nodeguard to use it", opts.Path, next.Policy().Revision)
	}
	if err := running.Replace(next); err != nil {
		return fmt.Errorf("bundle %s (revision %q): %w", opts.Path, next.Policy().Revision, err)
	}
	return nil
}

// addTree watches path's parent directory and, when path is a directory,
// path and every directory under it.
func addTree(w *fsnotify.Watcher, path string) error {
	if err := w.Add(filepath.Dir(filepath.Clean(path))); err != nil {
		return fmt.Errorf("watch %s: %w", filepath.Dir(path), err)
	}
	info, err := os.Stat(path)
	if err != nil || !info.IsDir() {
		return nil
	}
	return filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if err := w.Add(p); err != nil {
			return fmt.Errorf("watch %s: %w", p, err)
		}
		return nil
	})
}
