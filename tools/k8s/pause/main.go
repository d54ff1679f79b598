// The pod sandbox ("pause") image of the real test node: no registry is reachable, so
// registry.k8s.io/pause cannot be pulled. It holds the pod's namespaces open, reaps
// children (it is PID 1 when a pod shares its PID namespace) and exits 0 on SIGTERM or
// SIGINT, which is all the kubelet asks of it. Built static (CGO_ENABLED=0) by
// tools/k8s/images.py and packed as the image's only file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
