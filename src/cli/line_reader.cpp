#include "cli/line_reader.h"

#include <fcntl.h>
#include <histedit.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <iostream>

namespace quern::cli {

std::atomic<bool> ChatInterrupt::flag_{false};
int ChatInterrupt::wake_[2] = {-1, -1};

namespace {
struct sigaction g_previous;
}  // namespace

void ChatInterrupt::on_signal(int) {
    flag_.store(true);
    const char x = 'x';
    if (wake_[1] >= 0) [[maybe_unused]] const ssize_t n = ::write(wake_[1], &x, 1);  // async-signal-safe
}

ChatInterrupt::ChatInterrupt() {
    if (::pipe(wake_) == 0) {
        for (int fd : wake_) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    } else {
        wake_[0] = wake_[1] = -1;
    }
    struct sigaction sa {};
    sa.sa_handler = &ChatInterrupt::on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, &g_previous);
    flag_.store(false);
}

ChatInterrupt::~ChatInterrupt() {
    sigaction(SIGINT, &g_previous, nullptr);
    for (int& fd : wake_) {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
}

bool ChatInterrupt::take() { return flag_.exchange(false); }

void ChatInterrupt::drain() {
    char buf[64];
    if (wake_[0] >= 0)
        while (::read(wake_[0], buf, sizeof buf) > 0) {
        }
}

struct LineReader::Editor {
    EditLine* el = nullptr;
    History* hist = nullptr;
    HistEvent ev{};
    std::string prompt;
    /// ^C at the prompt (the editor's raw mode reads it as a key): the line
    /// is abandoned.
    static unsigned char on_ctrl_c(EditLine*, int) {
        ChatInterrupt::raise();
        return CC_EOF;
    }
    /// The editor's character reader: stdin, one UTF-8 character at a time,
    /// or 0 (end of the line's input) when a Ctrl-C wakes the wait — a
    /// signal alone may land before the editor blocks in read() and be lost.
    static int getc(EditLine*, wchar_t* c) {
        for (;;) {
            if (ChatInterrupt::take()) {
                ChatInterrupt::raise();  // for read() to see
                return 0;
            }
            pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {ChatInterrupt::wake_fd(), POLLIN, 0}};
            const int r = ::poll(fds, ChatInterrupt::wake_fd() >= 0 ? 2 : 1, -1);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return -1;
            if (fds[1].revents) {
                ChatInterrupt::drain();
                continue;  // the flag says it
            }
            unsigned char b[4];
            if (::read(STDIN_FILENO, b, 1) != 1) return 0;
            const int n = b[0] < 0x80 ? 1 : (b[0] >> 5) == 6 ? 2 : (b[0] >> 4) == 14 ? 3 : (b[0] >> 3) == 30 ? 4 : 1;
            uint32_t cp = n == 1 ? b[0] : n == 2 ? (b[0] & 0x1Fu) : n == 3 ? (b[0] & 0x0Fu) : (b[0] & 0x07u);
            for (int k = 1; k < n; ++k) {
                if (::read(STDIN_FILENO, b + k, 1) != 1) return 0;
                cp = (cp << 6) | (b[k] & 0x3Fu);
            }
            *c = static_cast<wchar_t>(cp);
            return 1;
        }
    }
    static char* prompt_of(EditLine* el) {
        void* self = nullptr;
        el_get(el, EL_CLIENTDATA, &self);
        return const_cast<char*>(static_cast<Editor*>(self)->prompt.c_str());
    }
};

LineReader::LineReader(bool tty) {
    if (!tty) return;
    ed_ = new Editor;
    ed_->el = el_init("quern", stdin, stdout, stderr);
    ed_->hist = history_init();
    if (!ed_->el || !ed_->hist) {  // no terminal to edit on after all: read plainly
        if (ed_->el) el_end(ed_->el);
        if (ed_->hist) history_end(ed_->hist);
        delete ed_;
        ed_ = nullptr;
        return;
    }
    history(ed_->hist, &ed_->ev, H_SETSIZE, 1000);
    history(ed_->hist, &ed_->ev, H_SETUNIQUE, 1);
    el_set(ed_->el, EL_CLIENTDATA, ed_);
    el_set(ed_->el, EL_PROMPT, &Editor::prompt_of);
    el_set(ed_->el, EL_EDITOR, "emacs");
    el_set(ed_->el, EL_HIST, history, ed_->hist);
    el_set(ed_->el, EL_GETCFN, &Editor::getc);
    el_set(ed_->el, EL_ADDFN, "quern-interrupt", "Abandon the line", &Editor::on_ctrl_c);
    el_set(ed_->el, EL_BIND, "^C", "quern-interrupt", nullptr);
    el_source(ed_->el, nullptr);  // the user's ~/.editrc, as other libedit programs read it
}

LineReader::~LineReader() {
    if (!ed_) return;
    el_end(ed_->el);
    history_end(ed_->hist);
    delete ed_;
}

LineReader::Result LineReader::read(const std::string& prompt, std::string& line) {
    line.clear();
    if (!ed_) {
        if (!std::getline(std::cin, line)) return Result::End;
        return Result::Line;
    }
    ed_->prompt = prompt;
    // A Ctrl-C that came since the last reply ended (the reply loop takes
    // those during a reply) is for this prompt: a second one typed right
    // after the first prompt's note, before the editor reads, must leave.
    ChatInterrupt::drain();
    int n = 0;
    const char* s = el_gets(ed_->el, &n);
    if (ChatInterrupt::take()) {
        el_reset(ed_->el);  // the half-typed line goes
        return Result::Interrupted;
    }
    if (!s || n <= 0) return Result::End;
    line.assign(s, static_cast<size_t>(n));
    if (!line.empty() && line.back() == '\n') line.pop_back();
    return Result::Line;
}

void LineReader::remember(const std::string& line) {
    if (ed_ && !line.empty()) history(ed_->hist, &ed_->ev, H_ENTER, line.c_str());
}

}  // namespace quern::cli
