package bench

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// brokerConnections is how many established TCP connections process pid
// holds to one of ports: the broker connections of its sinks, which share
// one per endpoint and credentials. Read from /proc: the sockets among
// the process's file descriptors, looked up in its network namespace's
// TCP tables (state 01, established).
func brokerConnections(pid int, ports map[int]bool) (int64, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var n int64
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue // no IPv6
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "01" || !inodes[f[9]] {
				continue
			}
			_, hexPort, _ := strings.Cut(f[2], ":")
			if port, err := strconv.ParseUint(hexPort, 16, 16); err == nil && ports[int(port)] {
				n++
			}
		}
	}
	return n, nil
}

// brokerPorts are the TCP ports of t's brokers: those of the sink's url
// (servers comma-separated) or brokers.
func (t *target) brokerPorts() map[int]bool {
	var addrs []string
	if u, ok := t.config["url"].(string); ok {
		addrs = strings.Split(u, ",")
	}
	if bs, ok := t.config["brokers"].([]string); ok {
		addrs = append(addrs, bs...)
	}
	ports := map[int]bool{}
	for _, a := range addrs {
		a = strings.TrimSpace(a)
		port := ""
		if u, err := url.Parse(a); err == nil && u.Host != "" {
			port = u.Port()
		} else if _, p, err := net.SplitHostPort(a); err == nil {
			port = p
		}
		if p, err := strconv.Atoi(port); err == nil {
			ports[p] = true
		}
	}
	return ports
}
