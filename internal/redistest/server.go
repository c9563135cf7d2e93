package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

const (
	// readyTimeout bounds how long a freshly started server may take to
	// answer PING: only one that never does should fail a test, however
	// loaded the machine.
	readyTimeout = time.Minute
	// stopTimeout is how long Stop waits after SIGTERM before sending SIGKILL.
	stopTimeout = 5 * time.Second
	// startAttempts is how many ports are tried before giving up on a start.
	startAttempts = 3
	// logFileName is the file in the server's directory receiving its stdout and stderr.
	logFileName = "redis-server.log"
	// logTailBytes bounds how much of the log is quoted in a startup error.
	logTailBytes = 4096
	// maxPort is the highest valid TCP port.
	maxPort = 65535
	// clusterBusOffset is the distance between a cluster node's port and its bus port.
	clusterBusOffset = 10000
)

// errExited reports that redis-server exited before it answered PING.
var errExited = errors.New("redis-server exited before answering PING")

// Server is a redis-server process owned by the test binary, listening on
// 127.0.0.1 with its own temporary directory. Its methods are safe for
// concurrent use.
type Server struct {
	mu        sync.Mutex
	port      int
	dir       string
	extraArgs []string
	cluster   bool // port+10000 is reserved as the cluster bus port
	proc      *process
}

// process is one run of redis-server.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start starts a dedicated redis-server for one test (extra args appended to
// the command line, e.g. "--maxmemory", "64mb"); it is stopped by tb.Cleanup.
// It skips or fails the test as Require does when redis-server is missing.
func Start(tb testing.TB, extraArgs ...string) *Server {
	tb.Helper()
	Require(tb)
	s, err := startServer(extraArgs, false)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.close(); err != nil {
			tb.Errorf("redistest: %v", err)
		}
	})
	return s
}

// StartClusterNode starts a dedicated redis-server with cluster mode on (extra
// args appended, e.g. "--cluster-node-timeout", "500"), for a test that builds
// and breaks a cluster of its own; it is stopped by tb.Cleanup. Its cluster
// bus port is port+10000, reserved like the shared cluster's: Redis 6.x has
// no --cluster-port setting to choose another. It skips or fails the test as
// Require does when redis-server is missing.
func StartClusterNode(tb testing.TB, extraArgs ...string) *Server {
	tb.Helper()
	Require(tb)
	s, err := startServer(append([]string{"--cluster-enabled", "yes"}, extraArgs...), true)
	if err != nil {
		tb.Fatalf("redistest: cluster node: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.close(); err != nil {
			tb.Errorf("redistest: %v", err)
		}
	})
	return s
}

// Addr returns the server's address, "127.0.0.1:port".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port()))
}

// Port returns the TCP port the server listens on; it stays the same across
// restarts.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// Pid returns the process id of the most recently started redis-server
// process; it changes on Restart.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Stop sends SIGTERM and waits for the server to exit, sending SIGKILL if it
// is still running after 5s. Stopping a server that is not running is a
// no-op. The directory is kept, so Restart can follow.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked()
}

// Kill sends SIGKILL and waits for the server to exit. Killing a server that
// is not running is a no-op.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proc
	if p == nil || p.exited() {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill redis-server (pid %d): %w", p.cmd.Process.Pid, err)
	}
	<-p.done
	return nil
}

// Restart starts the server again on the same port and directory and waits
// until it answers PING. A server that is still running is stopped first.
// It fails the test if the server does not come back.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
	if err := s.startLocked(); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}

// running reports whether the server process is alive.
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && !s.proc.exited()
}

// close stops the server and removes its directory.
func (s *Server) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	stopErr := s.stopLocked()
	var rmErr error
	if err := os.RemoveAll(s.dir); err != nil {
		rmErr = fmt.Errorf("remove redis-server dir: %w", err)
	}
	releasePort(s.port, s.cluster)
	return errors.Join(stopErr, rmErr)
}

func (s *Server) stopLocked() error {
	p := s.proc
	if p == nil || p.exited() {
		return nil
	}
	pid := p.cmd.Process.Pid
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop redis-server (pid %d): %w", pid, err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill redis-server (pid %d) after SIGTERM timeout: %w", pid, err)
	}
	<-p.done
	return nil
}

// startServer starts a redis-server on a fresh port in a fresh temporary
// directory, retrying with new ports when the start fails (for example
// because another process grabbed the port in the meantime). With cluster
// set, the cluster bus port (port+10000) is checked to be free too.
func startServer(extraArgs []string, cluster bool) (*Server, error) {
	var errs []error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		s, err := tryStartServer(extraArgs, cluster)
		if err == nil {
			return s, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
	}
	return nil, fmt.Errorf("start redis-server: %w", errors.Join(errs...))
}

func tryStartServer(extraArgs []string, cluster bool) (*Server, error) {
	port, err := freePort(cluster)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		releasePort(port, cluster)
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	s := &Server{port: port, dir: dir, extraArgs: extraArgs, cluster: cluster}
	s.mu.Lock()
	err = s.startLocked()
	s.mu.Unlock()
	if err != nil {
		// The process has already been reaped by startLocked on failure.
		_ = os.RemoveAll(dir)
		releasePort(port, cluster)
		return nil, err
	}
	return s, nil
}

// args returns the redis-server command line (without the program name).
func (s *Server) args() []string {
	args := []string{
		"--bind", "127.0.0.1",
		"--port", strconv.Itoa(s.port),
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--protected-mode", "no",
	}
	return append(args, s.extraArgs...)
}

// startLocked starts redis-server and waits until it answers PING. On
// failure the process is killed and reaped, and the error quotes the tail of
// its log.
func (s *Server) startLocked() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("find redis-server: %w", err)
	}
	logPath := s.logPath()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open redis-server log: %w", err)
	}
	var logStart int64
	if info, err := logFile.Stat(); err == nil {
		logStart = info.Size()
	}

	cmd := exec.Command(bin, s.args()...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	setProcAttr(cmd)
	startErr := cmd.Start()
	// The child holds its own copy of the descriptor.
	closeErr := logFile.Close()
	if startErr != nil {
		return fmt.Errorf("run redis-server on port %d: %w", s.port, startErr)
	}

	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status of a server we stop ourselves is not interesting
		close(p.done)
	}()
	s.proc = p
	if closeErr != nil {
		s.killLocked()
		return fmt.Errorf("close redis-server log: %w", closeErr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := waitReady(ctx, s.addrLocked(), p); err != nil {
		s.killLocked()
		return fmt.Errorf("redis-server on port %d: %w\n%s", s.port, err, logTail(logPath, logStart))
	}
	return nil
}

// killLocked sends SIGKILL and waits for the process to be reaped, ignoring
// errors; used to clean up after a failed start.
func (s *Server) killLocked() {
	if s.proc == nil {
		return
	}
	_ = s.proc.cmd.Process.Kill()
	<-s.proc.done
}

func (s *Server) addrLocked() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

func (s *Server) logPath() string {
	return filepath.Join(s.dir, logFileName)
}

// waitReady polls PING until the server answers, the process exits or ctx is
// done. It also checks that the answering server is our process and not
// another redis-server that owns the port.
func waitReady(ctx context.Context, addr string, p *process) error {
	client := newClient(addr)
	defer client.Close()
	wantPid := strconv.Itoa(p.cmd.Process.Pid)
	delay := 5 * time.Millisecond
	var lastErr error
	for {
		if p.exited() {
			return fmt.Errorf("%w (%s)", errExited, p.cmd.ProcessState)
		}
		// Dial first: go-redis logs every failed dial and, once a pool's
		// dials have failed, keeps failing fast for a while.
		lastErr = dialCheck(ctx, addr)
		if lastErr == nil {
			lastErr = client.Ping(ctx).Err()
		}
		if lastErr == nil {
			pid, err := serverPid(ctx, client)
			if err != nil {
				lastErr = err
			} else if pid != wantPid {
				// Another redis-server answered; ours is about to fail to bind.
				lastErr = fmt.Errorf("port %s is served by another redis-server (pid %s)", addr, pid)
			} else {
				return nil
			}
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("not answering PING after %v: %w", readyTimeout, lastErr)
		case <-p.done:
			timer.Stop()
		case <-timer.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// dialCheck reports whether a TCP connection to addr can be opened.
func dialCheck(ctx context.Context, addr string) error {
	dialer := net.Dialer{Timeout: 200 * time.Millisecond}
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	if err := conn.Close(); err != nil {
		return fmt.Errorf("close probe connection: %w", err)
	}
	return nil
}

// serverPid returns the process_id field of INFO server.
func serverPid(ctx context.Context, client *redis.Client) (string, error) {
	info, err := client.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("INFO server: %w", err)
	}
	for line := range strings.Lines(info) {
		if pid, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return pid, nil
		}
	}
	return "", errors.New("INFO server has no process_id")
}

// newClient returns a single-connection client with short timeouts, suited to
// probing a server that may not be up yet.
func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                     addr,
		DialTimeout:              500 * time.Millisecond,
		ReadTimeout:              time.Second,
		WriteTimeout:             time.Second,
		MaxRetries:               -1,
		DialerRetries:            1,
		PoolSize:                 1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// logTail returns the end of the log written since offset start, for error
// messages.
func logTail(path string, start int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	if info, err := f.Stat(); err == nil && info.Size()-start > logTailBytes {
		start = info.Size() - logTailBytes
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return fmt.Sprintf("(reading log: %v)", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(reading log: %v)", err)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return "(log " + path + " is empty)"
	}
	return "log tail (" + path + "):\n" + string(data)
}

var (
	portsMu sync.Mutex
	// portsInUse holds ports (and cluster bus ports) handed out to servers of
	// this process that have not been closed, so they are not handed out twice.
	portsInUse = map[int]bool{}
)

// freePort returns a port on 127.0.0.1 that is free right now (and, with
// cluster set, whose cluster bus port is free too) and reserves it within this
// process until releasePort.
func freePort(cluster bool) (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	var lastErr error
	for range 100 {
		port, err := probePort(0)
		if err != nil {
			lastErr = err
			continue
		}
		if portsInUse[port] {
			continue
		}
		if cluster {
			bus := port + clusterBusOffset
			if bus > maxPort || portsInUse[bus] {
				continue
			}
			if _, err := probePort(bus); err != nil {
				lastErr = err
				continue
			}
			portsInUse[bus] = true
		}
		portsInUse[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("find a free port on 127.0.0.1: %w", errors.Join(errors.New("no candidate left"), lastErr))
}

// releasePort forgets a reservation made by freePort.
func releasePort(port int, cluster bool) {
	portsMu.Lock()
	defer portsMu.Unlock()
	delete(portsInUse, port)
	if cluster {
		delete(portsInUse, port+clusterBusOffset)
	}
}

// probePort listens on 127.0.0.1:port (0 for any) and returns the port that
// was bound.
func probePort(port int) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0, fmt.Errorf("probe port: %w", err)
	}
	addr, ok := l.Addr().(*net.TCPAddr)
	closeErr := l.Close()
	if !ok {
		return 0, fmt.Errorf("probe port: unexpected listener address %v", l.Addr())
	}
	if closeErr != nil {
		return 0, fmt.Errorf("close port probe: %w", closeErr)
	}
	return addr.Port, nil
}
