// Reading what the user types in `quern chat`: on a terminal with line
// editing and history through libedit (BSD-licensed, packaged by Debian, the
// line editor of the BSDs and macOS, with emacs and vi key bindings — GNU
// readline's GPL would bind quern's licence), from a pipe line by line.
//
// Ctrl-C is caught while the chat runs (ChatInterrupt): at the prompt it
// abandons the line, during a reply it stops the reply; the chat decides what
// a second one means.
#pragma once
#include <atomic>
#include <string>

namespace quern::cli {

/// SIGINT turned into a flag for as long as this object lives (the default
/// action, exiting, comes back after).
class ChatInterrupt {
public:
    ChatInterrupt();
    ~ChatInterrupt();
    /// Whether a Ctrl-C came since the last call (and forgets it).
    static bool take();
    /// As a Ctrl-C does (the line editor reads ^C as a key at its prompt).
    static void raise() { flag_.store(true); }
    /// A descriptor that becomes readable at each Ctrl-C (a wait at the
    /// prompt wakes on it); -1 while no ChatInterrupt lives.
    static int wake_fd() { return wake_[0]; }
    /// Empties wake_fd().
    static void drain();

private:
    static std::atomic<bool> flag_;
    static int wake_[2];
    static void on_signal(int);
};

class LineReader {
public:
    /// `tty`: stdin is a terminal (edit lines there; else read them plainly).
    explicit LineReader(bool tty);
    ~LineReader();
    LineReader(const LineReader&) = delete;
    LineReader& operator=(const LineReader&) = delete;

    enum class Result { Line, Interrupted, End };
    /// One line without its newline: Line, Interrupted (Ctrl-C at the
    /// prompt: the line is dropped) or End (end of input, Ctrl-D).
    Result read(const std::string& prompt, std::string& line);
    /// Adds a line to the history (the up arrow recalls it).
    void remember(const std::string& line);

private:
    struct Editor;
    Editor* ed_ = nullptr;  // null when reading a pipe
};

}  // namespace quern::cli
