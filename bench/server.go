package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is a redis-server child process owned by the bench program.
type server struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startServer starts redis-server on 127.0.0.1 on a free port, without
// persistence, in a temporary directory, and waits until it answers PING.
func startServer() (*server, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := tryStartServer()
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func tryStartServer() (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redlimit-bench-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	s := &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(s.done) }()

	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-s.done:
			s.stop()
			return nil, fmt.Errorf("redis-server on port %d exited before answering PING", port)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on port %d: no PING answer in 10s: %w", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop terminates the server by its pid (SIGTERM, then SIGKILL after 5s)
// and removes its directory. It is safe to call more than once.
func (s *server) stop() {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
	default:
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			s.cmd.Process.Kill()
			<-s.done
		}
	}
	os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
