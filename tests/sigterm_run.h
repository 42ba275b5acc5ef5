// A real cgspn process asked to stop as a cluster asks it: forked, given SIGTERM once it has
// logged a few steps. Used by test_train and test_distill.
#pragma once
#include "testlib.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

// Forks `./cgspn COMMAND CONFIG` (stdout and stderr into log), waits until metrics (its run's
// metrics.jsonl) has 3 lines (60 s at most), sends SIGTERM and waits for the process. Returns
// what it printed; *status is its waitpid status.
static inline char *test_sigterm_cgspn(const char *command, const char *cfg, const char *log,
                                       const char *metrics, int *status) {
    if (access("./cgspn", X_OK) != 0) fail_msg("./cgspn is not built (make test builds it first)");
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int f = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(f, 1);
        dup2(f, 2);
        execl("./cgspn", "cgspn", command, cfg, (char *)NULL);
        _exit(127);
    }
    for (int tries = 0;; tries++) {
        if (tries > 60000) {
            kill(pid, SIGKILL);
            fail_msg("cgspn %s logged no steps in 60 s", command);
        }
        FILE *f = fopen(metrics, "r");
        int lines = 0;
        for (int ch; f && (ch = fgetc(f)) != EOF;) lines += ch == '\n';
        if (f) fclose(f);
        if (lines >= 3) break;
        usleep(1000);
    }
    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_int_equal(waitpid(pid, status, 0), pid);
    return test_read_text(log);
}
