/* The pod sandbox's program (the role of Kubernetes' pause): holds the pod's namespaces, exits 0 on
 * SIGINT/SIGTERM, reaps any child handed to it. Built static by scripts/testbed/build.sh (step pause). */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
  struct sigaction s = {0}, c = {0};
  s.sa_handler = stop;
  sigaction(SIGINT, &s, 0);
  sigaction(SIGTERM, &s, 0);
  c.sa_handler = reap;
  c.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &c, 0);
  for (;;) pause();
  return 0;
}
