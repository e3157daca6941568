"""The SpaceMouse and the SDL (pygame) gamepad.

The SpaceMouse reads byte-exact HID reports through a real FIFO (a byte stream, cut into reports by
size) and through a real pseudo-terminal (a character device like /dev/hidraw: one report per
read); find_spacemouse walks a sysfs-shaped directory. The SDL gamepad is driven by a virtual
joystick attached inside pygame's own SDL library (SDL_JoystickAttachVirtual through ctypes), so
pygame's event queue, axis and button events and the unplug event are the real ones.
"""

import ctypes
import importlib.util
import os
import select
import struct
import subprocess
import sys
import time
import tty
from pathlib import Path

import numpy as np
import pytest

from robo_rl.errors import ConfigError, RoboRLError
from robo_rl.hardware.teleop import (PadMap, PygameGamepad, SpaceMouse, SpaceMouseMap, TeleopInput,
                                     find_spacemouse, make_teleop)

ROOT = Path(__file__).parents[1]


def translation(x: int, y: int, z: int, rotation: tuple[int, int, int] | None = None) -> bytes:
    """HID report 1: x, y, z as little-endian int16; a combined report appends rx, ry, rz."""
    return bytes([1]) + struct.pack("<3h", x, y, z) + (struct.pack("<3h", *rotation) if rotation else b"")


def rotation(rx: int, ry: int, rz: int) -> bytes:
    return bytes([2]) + struct.pack("<3h", rx, ry, rz)


def buttons(mask: int, n_bytes: int = 2) -> bytes:
    return bytes([3]) + mask.to_bytes(n_bytes, "little")


@pytest.fixture
def fifo_mouse(tmp_path):
    """make(**SpaceMouseMap fields) -> (SpaceMouse on a FIFO, the writer's fd)."""
    path = tmp_path / "hidraw0"
    os.mkfifo(path)
    opened = []

    def make(**mapping) -> tuple[SpaceMouse, int]:
        mouse = SpaceMouse(str(path), SpaceMouseMap(**mapping), max_speed=0.1)
        writer = os.open(path, os.O_WRONLY)
        opened.append((mouse, writer))
        return mouse, writer

    yield make
    for mouse, writer in opened:
        mouse.close()
        try:
            os.close(writer)
        except OSError:
            pass  # the test closed it


def test_spacemouse_split_reports_move_the_selected_arm(fifo_mouse):
    mouse, w = fifo_mouse()
    assert mouse.poll().delta == {}  # no report yet
    os.write(w, translation(0, -350, 0))  # the cap pushed away from the operator, full scale
    mouse.poll()
    assert mouse.layout == "split"  # a 7-byte report 1 in one read
    time.sleep(0.05)
    moved = mouse.poll().delta["right"]
    assert 0.002 < moved[0] < 0.011 and moved[1] == 0.0 and moved[2] == 0.0
    # rotation is parsed and moves nothing; a partial report waits for its rest
    os.write(w, rotation(100, -200, 350) + translation(20, 0, -350)[:4])
    mouse.poll()
    np.testing.assert_allclose(mouse.rotation, [100 / 350, -200 / 350, 1.0])
    np.testing.assert_allclose(mouse.translation, [0.0, -1.0, 0.0])  # report 1 not complete yet
    os.write(w, translation(20, 0, -350)[4:])
    mouse.poll()
    time.sleep(0.05)
    up = mouse.poll().delta["right"]
    # x = 20/350 is inside the deadzone: no sideways drift; lifting the cap (-z) raises the arm
    assert up[0] == 0.0 and up[1] == 0.0 and 0.002 < up[2] < 0.011
    os.write(w, translation(-350, 0, 0))  # pushed left: +y
    mouse.poll()
    time.sleep(0.02)
    assert mouse.poll().delta["right"][1] > 0


def test_spacemouse_combined_report_carries_translation_and_rotation(fifo_mouse):
    mouse, w = fifo_mouse()
    os.write(w, translation(0, 0, 0, rotation=(1, 2, 3)))  # 13 bytes in one read: a combined report 1
    mouse.poll()
    assert mouse.layout == "combined"
    np.testing.assert_allclose(mouse.rotation, np.array([1, 2, 3]) / 350)
    report = translation(350, 0, 0, rotation=(0, 0, -350))
    os.write(w, report[:5])
    os.write(w, report[5:9])  # two partial writes: nothing applied yet
    mouse.poll()
    assert mouse.translation[0] == 0.0
    os.write(w, report[9:] + buttons(0b01))
    mouse.poll()
    np.testing.assert_allclose(mouse.translation, [1.0, 0.0, 0.0])
    np.testing.assert_allclose(mouse.rotation, [0.0, 0.0, -1.0])
    assert mouse.buttons == 0b01
    time.sleep(0.05)
    assert mouse.poll().delta["right"][1] < 0  # pushed right: -y


def test_spacemouse_layout_set_for_a_stream_that_starts_mid_flow(fifo_mouse):
    """A stream whose first read is not one whole report cannot tell the layouts apart: set it."""
    mouse, w = fifo_mouse(layout="combined")
    os.write(w, buttons(0) + translation(0, 350, 0, rotation=(0, 0, 0)) * 2)
    mouse.poll()
    np.testing.assert_allclose(mouse.translation, [0.0, 1.0, 0.0])


def send_buttons(mouse: SpaceMouse, w: int, *masks: int) -> TeleopInput:
    """Each button report in its own poll, as a human's presses arrive; what they all asked for."""
    out = TeleopInput()
    for mask in masks:
        os.write(w, buttons(mask))
        inp = mouse.poll()
        out.events += inp.events
        out.grip.update(inp.grip)
    return out


def test_spacemouse_buttons_click_switch_and_chord(fifo_mouse):
    mouse, w = fifo_mouse()
    inp = send_buttons(mouse, w, 0b01, 0b00)
    assert inp.events == [] and inp.grip == {"right": 0.0}  # left click: the selected gripper closes
    inp = send_buttons(mouse, w, 0b10, 0b00)
    assert inp.events == [] and inp.grip == {} and mouse.selected == "left"  # right click: next arm
    assert send_buttons(mouse, w, 0b01, 0b00).grip == {"left": 0.0}
    # both together: take over, and neither button clicks on release
    inp = send_buttons(mouse, w, 0b01, 0b11, 0b10, 0b00)
    assert inp.events == ["take_over"] and inp.grip == {} and mouse.selected == "left"


def test_spacemouse_buttons_held_end_recovery_and_correction(fifo_mouse):
    mouse, w = fifo_mouse(hold_s=0.05)
    for bit, event in ((0b01, "recovery_done"), (0b10, "correction_done")):
        assert send_buttons(mouse, w, bit).events == []
        time.sleep(0.08)
        assert mouse.poll().events == [event]  # while still held
        inp = send_buttons(mouse, w, 0b00)
        assert inp.events == [] and inp.grip == {} and mouse.selected == "right"  # the release does not click


def test_spacemouse_custom_buttons_act_on_press(fifo_mouse):
    """A Pro or Enterprise has more buttons: one mapped only to a click acts at once."""
    mouse, w = fifo_mouse(clicks={0: "grip", 1: "next_arm", 12: "take_over"}, button_bytes=4)
    os.write(w, buttons(1 << 12, 4))
    assert mouse.poll().events == ["take_over"]
    os.write(w, buttons(0, 4))
    assert mouse.poll().events == []


def test_spacemouse_end_of_stream_is_a_lost_device(fifo_mouse):
    mouse, w = fifo_mouse()
    os.write(w, translation(0, -350, 0))
    mouse.poll()
    os.close(w)  # the feeder went away with the cap deflected: the arm must not keep moving
    with pytest.raises(RoboRLError, match="end of stream"):
        mouse.poll()


def test_spacemouse_fifo_without_a_writer_yet_is_quiet(tmp_path):
    path = tmp_path / "hidraw0"
    os.mkfifo(path)
    mouse = SpaceMouse(str(path))
    try:
        assert mouse.poll().delta == {} and mouse.poll().events == []
    finally:
        mouse.close()


def test_spacemouse_stream_with_an_unknown_report_is_refused(fifo_mouse):
    mouse, w = fifo_mouse(layout="split")
    os.write(w, bytes([0x17, 0x64]))  # a wireless model's battery report has no size a stream can know
    with pytest.raises(RoboRLError, match="report id 23"):
        mouse.poll()


def test_spacemouse_on_a_character_device_reads_one_report_per_read():
    """hidraw hands over one whole report per read, whatever its length: a pty slave in raw mode is a
    character device too. Reports of any id and size are taken as they come, and the node failing
    with EIO (hidraw's answer once the device is unplugged; here the master closing) is an error."""
    master, slave = os.openpty()
    tty.setraw(slave)  # bytes through untouched (no CR/LF translation, no echo)
    mouse = SpaceMouse(os.ttyname(slave), max_speed=0.1)
    master_open = True
    try:
        assert mouse.one_report_per_read

        def send(report: bytes) -> None:
            os.write(master, report)
            assert select.select([mouse.fd], [], [], 2.0)[0], "the pty did not deliver"
            mouse.poll()

        send(translation(0, -350, 0, rotation=(7, 8, 9)))  # combined, recognised by its length alone
        np.testing.assert_allclose(mouse.rotation, np.array([7, 8, 9]) / 350)
        send(bytes([0x17, 0x64]))  # battery level: ignored
        send(buttons(0b01, 3))  # a button report of any length
        send(buttons(0, 3))
        assert mouse.gripper["right"] == 0.0
        time.sleep(0.05)
        assert 0.002 < mouse.poll().delta["right"][0] < 0.011
        os.close(master)
        master_open = False
        with pytest.raises(RoboRLError, match="unplugged"):
            mouse.poll()
    finally:
        mouse.close()
        os.close(slave)
        if master_open:
            os.close(master)


def test_spacemouse_open_errors_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(RoboRLError, match="cannot open .*hidraw9"):
        SpaceMouse(str(tmp_path / "hidraw9"))
    with pytest.raises(ConfigError, match="input-event node"):
        make_teleop("spacemouse", path="/dev/input/js0")  # the gamepad's path left in a config
    with pytest.raises(ConfigError, match="button 0 click action 'jump'"):
        SpaceMouse(str(tmp_path / "hidraw9"), SpaceMouseMap(clicks={0: "jump"}))
    # a node this user may not read: the udev hint (as root, a child drops to nobody to see it)
    node = tmp_path / "hidraw5"
    node.write_bytes(b"")
    node.chmod(0)
    code = ("import os, sys\nfrom robo_rl.errors import RoboRLError\nfrom robo_rl.hardware.teleop import SpaceMouse\n"
            "if os.geteuid() == 0:\n    os.setgid(65534)\n    os.setuid(65534)\n"
            "try:\n    SpaceMouse(sys.argv[1])\nexcept RoboRLError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(node)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "permission denied" in r.stdout and "udev rule" in r.stdout and len(r.stdout.strip().splitlines()) == 1


def write_hidraw_node(sysfs: Path, dev: Path, name: str, hid_id: str, hid_name: str) -> None:
    (sysfs / name / "device").mkdir(parents=True)
    (sysfs / name / "device" / "uevent").write_text(
        f"DRIVER=hid-generic\nHID_ID={hid_id}\nHID_NAME={hid_name}\nHID_PHYS=usb-0000:00:14.0-2/input0\n")
    (dev / name).write_bytes(b"")


def test_find_spacemouse_reads_the_sysfs_uevents(tmp_path):
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    dev.mkdir()
    sysfs.mkdir()
    with pytest.raises(RoboRLError, match="no SpaceMouse found.*256f"):
        find_spacemouse(sysfs, dev)
    write_hidraw_node(sysfs, dev, "hidraw0", "0003:0000046D:0000C52B", "Logitech USB Receiver")  # a mouse
    write_hidraw_node(sysfs, dev, "hidraw1", "0003:0000256F:0000C652", "3Dconnexion CadMouse")
    with pytest.raises(RoboRLError, match="no SpaceMouse found"):
        find_spacemouse(sysfs, dev)
    write_hidraw_node(sysfs, dev, "hidraw10", "0003:0000046D:0000C626", "3Dconnexion SpaceNavigator")
    assert find_spacemouse(sysfs, dev) == str(dev / "hidraw10")
    write_hidraw_node(sysfs, dev, "hidraw3", "0003:0000256F:0000C635", "3Dconnexion SpaceMouse Compact")
    assert find_spacemouse(sysfs, dev) == str(dev / "hidraw3")  # hidraw3 before hidraw10
    (dev / "hidraw3").unlink()
    with pytest.raises(RoboRLError, match="SpaceMouse Compact .*256f:c635.* does not exist"):
        find_spacemouse(sysfs, dev)
    with pytest.raises(RoboRLError, match="needs Linux hidraw"):
        find_spacemouse(tmp_path / "nowhere", dev)


def test_make_teleop_opens_a_spacemouse_and_lists_every_kind(tmp_path):
    path = tmp_path / "hidraw0"
    os.mkfifo(path)
    device = make_teleop("spacemouse", path=str(path), max_speed=0.2, step_m=0.005)  # others' options ignored
    try:
        assert isinstance(device, SpaceMouse) and device.state.max_speed == 0.2
    finally:
        device.close()
    with pytest.raises(ConfigError, match="keyboard, gamepad, pygame, spacemouse"):
        make_teleop("joystick")


# ---------------------------------------------------------------------------- the SDL gamepad
needs_pygame = pytest.mark.skipif(importlib.util.find_spec("pygame") is None,
                                  reason="pygame not installed (the teleop extra): pip install -e '.[teleop]'")


@needs_pygame
def test_pygame_without_a_pad_is_a_one_line_error():
    """In a fresh process with no display: SDL gets its dummy video driver by itself and finds no pad."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER")}
    code = ("import os\nfrom robo_rl.errors import RoboRLError\nfrom robo_rl.hardware.teleop import make_teleop\n"
            "try:\n    make_teleop('pygame').close()\n    print('OPENED')\nexcept RoboRLError as e:\n    print(e)\n"
            "print(os.environ.get('SDL_VIDEODRIVER'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    if r.stdout.startswith("OPENED"):
        pytest.skip("a real gamepad is plugged into this machine")
    assert r.stdout.splitlines() == ["no gamepad found by SDL; plug one in (check the OS lists it) or use teleop=keyboard",
                                     "dummy"]
    # a user's own video driver is left alone
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**env, "SDL_VIDEODRIVER": "offscreen"}, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "offscreen", r.stdout + r.stderr


class VirtualPad:
    """A joystick attached inside the SDL library pygame itself loaded: SDL then delivers its axis,
    button and removal events through pygame's event queue like a USB pad's."""

    def __init__(self, n_axes: int = 6, n_buttons: int = 8):
        maps = Path("/proc/self/maps")
        libs = [line.split()[-1] for line in maps.read_text().splitlines() if "libSDL2" in line] if maps.exists() else []
        if not libs:
            pytest.skip("cannot locate the SDL library pygame loaded (/proc/self/maps)")
        sdl = ctypes.CDLL(libs[0])  # the same, already loaded library: its joystick list is pygame's
        if not hasattr(sdl, "SDL_JoystickAttachVirtual"):
            pytest.skip("pygame's SDL is older than 2.0.14: no virtual joysticks")
        sdl.SDL_JoystickFromInstanceID.restype = ctypes.c_void_p
        sdl.SDL_JoystickSetVirtualAxis.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int16]
        sdl.SDL_JoystickSetVirtualButton.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint8]
        self.sdl = sdl
        self.index = sdl.SDL_JoystickAttachVirtual(0, n_axes, n_buttons, 0)  # type 0: every axis rests at 0
        assert self.index >= 0, "SDL_JoystickAttachVirtual failed"
        self.handle = None

    def opened(self, instance_id: int) -> None:
        self.handle = self.sdl.SDL_JoystickFromInstanceID(instance_id)  # SDL sets a virtual pad's state once open

    def axis(self, number: int, value: int) -> None:
        assert self.sdl.SDL_JoystickSetVirtualAxis(self.handle, number, value) == 0

    def button(self, number: int, down: bool) -> None:
        assert self.sdl.SDL_JoystickSetVirtualButton(self.handle, number, int(down)) == 0

    def unplug(self) -> None:
        if self.index >= 0:
            self.sdl.SDL_JoystickDetachVirtual(self.index)
            self.index = -1


@pytest.fixture
def sdl_pad(monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")  # restored after the test
    import pygame

    pygame.display.init()
    pygame.joystick.init()
    pad = VirtualPad()
    gamepad = PygameGamepad(pad.index, max_speed=0.1)
    pad.opened(gamepad.instance_id)
    yield pad, gamepad
    gamepad.close()
    pad.unplug()
    pygame.joystick.quit()
    pygame.display.quit()


@needs_pygame
def test_pygame_gamepad_maps_sticks_and_buttons_like_the_linux_one(sdl_pad):
    pad, gamepad = sdl_pad
    gamepad.poll()  # the events of opening it; starts the clock
    pad.axis(1, -32767)  # left stick forward
    pad.button(0, True)  # A: take over
    pad.button(4, True)  # LB: left gripper
    first = gamepad.poll()
    assert first.events == ["take_over"] and first.grip == {"left": 0.0}
    time.sleep(0.05)
    moved = gamepad.poll().delta["right"]
    assert 0.002 < moved[0] < 0.011 and abs(moved[1]) < 1e-9
    pad.button(0, False)
    pad.button(4, False)
    pad.axis(1, 0)
    pad.axis(0, 2000)  # inside the deadzone
    pad.button(3, True)  # Y: next arm
    pad.button(2, True)  # X: correction done
    inp = gamepad.poll()
    assert gamepad.selected == "left" and inp.events == ["correction_done"]
    time.sleep(0.02)
    assert gamepad.poll().delta == {}
    pad.axis(4, 32767)  # right stick down: the left arm goes down
    gamepad.poll()
    time.sleep(0.02)
    assert gamepad.poll().delta["left"][2] < 0
    pad.unplug()
    with pytest.raises(RoboRLError, match="unplugged"):
        gamepad.poll()


@needs_pygame
def test_pygame_gamepad_index_and_mapping_errors(sdl_pad):
    pad, _ = sdl_pad
    import pygame

    with pytest.raises(ConfigError, match=f"gamepad index 99 out of range; SDL sees {pygame.joystick.get_count()}"):
        PygameGamepad(99)
    with pytest.raises(ConfigError, match="axis 1 maps to xyz index 3"):
        PygameGamepad(pad.index, PadMap(axes={1: (3, 1.0)}))
