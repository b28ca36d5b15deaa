package devenv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// FreePort asks the kernel for a free TCP port on the loopback interface.
//
// It picks below the kernel's ephemeral range when it can: a port from that range (what
// listening on :0 gives) may be taken by some process's outgoing connection before the caller
// binds it, which many tests starting servers at once do make happen. A port it gives is
// claimed for a few minutes (claimPort), so that no other caller on this machine is given it
// while the first one's child is still starting.
func FreePort() (int, error) {
	lo := ephemeralLow()
	for range 50 {
		port := 10000 + rand.IntN(lo-10000)
		if CheckAddrFree("127.0.0.1:"+strconv.Itoa(port), "") == nil && claimPort(port) {
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 when unknown).
func ephemeralLow() int {
	b, _ := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	var lo int
	if _, err := fmt.Sscan(string(b), &lo); err != nil || lo <= 11000 {
		return 32768
	}
	return lo
}

// claimPeriod is how long a claim lasts, at least (and at most twice that).
const claimPeriod = 2 * time.Minute

// claimPort claims port among every process on this machine for one to two claim periods: a file
// named for the port and the current period, made only if neither it nor the previous period's
// exists. Creating with O_EXCL makes two claims of one port in one period impossible, and no
// claim is ever removed while it counts. When claims cannot be written, the bind check alone
// decides.
func claimPort(port int) bool {
	dir := filepath.Join(os.TempDir(), "kasa-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	period := time.Now().UnixNano() / int64(claimPeriod)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries { // the claims of periods that no longer count
		_, p, ok := strings.Cut(e.Name(), "-")
		if n, err := strconv.ParseInt(p, 10, 64); ok && err == nil && n < period-1 {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	name := func(p int64) string { return filepath.Join(dir, fmt.Sprintf("%d-%d", port, p)) }
	if _, err := os.Stat(name(period - 1)); err == nil {
		return false
	}
	f, err := os.OpenFile(name(period), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
	if err != nil {
		return !errors.Is(err, fs.ErrExist) // taken, or claims cannot be written here
	}
	return f.Close() == nil
}

// ExitGrace is how long a start waits for a process on its way out to let go of what it needs:
// the children of a launcher killed a moment ago stop on their parent's death, not at once.
const ExitGrace = 15 * time.Second

// WaitAddrFree is CheckAddrFree of each address and its setting (given in pairs), each given up
// to ExitGrace for the process on it to go.
func WaitAddrFree(ctx context.Context, addrSetting ...string) error {
	for i := 0; i+1 < len(addrSetting); i += 2 {
		var err error
		_ = poll(ctx, ExitGrace, func() bool { err = CheckAddrFree(addrSetting[i], addrSetting[i+1]); return err == nil })
		if err != nil {
			return err
		}
	}
	return nil
}

// poll asks done now and then every 100 ms until it says yes or grace has passed; ctx's end is
// its error.
func poll(ctx context.Context, grace time.Duration, done func() bool) error {
	deadline := time.Now().Add(grace)
	for !done() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// CheckAddrFree fails when addr cannot be bound now, naming setting, the configuration that
// chose it: a child started on it would fail to bind, and another process would answer for it.
func CheckAddrFree(addr, setting string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s (%s) is taken by another process: %w", addr, setting, err)
	}
	return l.Close()
}
